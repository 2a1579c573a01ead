"""Vertical fusion beyond FuseOps: layout-only kernels (reshape, transpose, squeeze, split, ...:
every block stores one load of its input, no arithmetic) become index maps of the kernels that
read them (prologue), so no copy kernel is left between a producer and its consumers. A cast
(one load converted to another type) counts as one: a reduced-precision build puts one after
each fp32 layer norm that feeds an fp16 matmul, and FuseOps leaves it alone when the norm's
output is also read in fp32 (the residual).

A layout kernel read by several kernels is recomputed in each (a copy costs no DRAM once it is
an index map); chains of layout kernels fold together. A layout kernel whose value leaves the
model folds into its producer's store instead (epilogue) when that producer has no other reader.
"""
from __future__ import annotations

import tvm_ffi
from tvm import relax, s_tir, tirx

from .analyze import is_conversion, is_copy
from .graph import KernelGraph


def is_layout_only(func: tirx.PrimFunc) -> bool:
    """Every block stores a plain load (a copy with an index map) or its cast, no reduction, no padding."""
    blocks: list = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, blocks.append), order="post")
    real = [b for b in blocks if b.iter_vars or not isinstance(b.body, tirx.SeqStmt)]
    real = [b for b in real if b.name_hint != "root"]
    if not real:
        return False
    for b in real:
        if b.init is not None or any(iv.iter_type != tirx.IterVar.DataPar for iv in b.iter_vars):
            return False
        if not (is_copy(b) or is_conversion(b)):
            return False
    return True


def layout_kernels(g: KernelGraph) -> set[int]:
    return {i for i, c in g.calls.items() if is_layout_only(c.prim)}


def fold_plan(g: KernelGraph, refused: set[int]) -> dict[int, list[int]]:
    """Host call -> the layout bindings (calls and their tuple items) folded into it, in data-flow
    order. `refused` hosts take nothing (their trial schedule failed)."""
    layout = layout_kernels(g)
    items = {i for i, b in enumerate(g.bindings) if isinstance(b.value, relax.TupleGetItem)
             and g.producer.get(b.value.tuple_value) in layout}
    movable = layout | items
    hosts = {i for i in g.calls if i not in layout and i not in refused}

    # a layout binding folds when it leaves no value behind: every reader takes it
    folds = set(movable - g.returned)
    changed = True
    while changed:
        changed = False
        for i in sorted(folds):
            readers = g.consumers[i]
            if not readers or any(r not in hosts and r not in folds for r in readers):
                folds.discard(i)
                changed = True
    plan: dict[int, list[int]] = {}
    for h in sorted(hosts):
        chain = _upstream(g, h, folds)
        if chain:
            plan[h] = sorted(chain)
    return plan


def _upstream(g: KernelGraph, start: int, folds: set[int]) -> set[int]:
    seen: set[int] = set()
    stack = [start]
    while stack:
        for j in g.call_inputs(stack.pop()):
            if j in folds and j not in seen:
                seen.add(j)
                stack.append(j)
    return seen


def epilogue_plan(g: KernelGraph, folded: set[int]) -> dict[int, list[int]]:
    """Producer call -> layout calls (values that leave the model, or are otherwise left) to store
    through: a layout kernel whose single input comes from a call read by nothing else."""
    layout = layout_kernels(g) - folded
    plan: dict[int, list[int]] = {}
    for i in sorted(layout):
        ins = g.call_inputs(i)
        if len(ins) != 1 or ins[0] not in g.calls or ins[0] in layout:
            continue
        p = ins[0]
        if g.consumers[p] == [i] and p not in g.returned:
            plan.setdefault(p, []).append(i)
    return plan
