"""Concatenations assembled in place: the kernels that produce a Concat's inputs write straight
into their slices of its output, and the concat kernel (a full copy of its output) is dropped.

A part can live inside the output when it is one contiguous byte range of it: the concat axis
has only dims of 1 before it (channels of NCHW / NCHWc at batch 1, a sequence at batch 1), and
its byte offset keeps the arena's 64-byte alignment. Every part must be an intermediate that
no other concat claims and that is not a model input or output (the runtime binds those to the
caller's buffers). The plan then holds an `assemble` step in place of the kernel call: the
runtime checks that the parts tile the output and runs nothing. Nested concats (a DenseNet
block's growing feature map, an Inception module feeding the next concat) chain: a concat's
output is itself a part of the next one, and everything lands in the last one's buffer.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import Call, TensorLoad
from tvm.ir.prim.expr import Select

from ..codegen.graph import Graph
from .memory import ALIGN


@dataclass(frozen=True)
class Assembly:
    """One concat kept in place: the call it replaces, its output and parts, each part's byte
    offset inside the output."""

    call: int
    out: int
    parts: tuple[int, ...]
    deltas: tuple[int, ...]


def _blocks(func: tirx.PrimFunc) -> list:
    found: list = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, found.append), order="post")
    return [b for b in found if b.name_hint != "root"]


def concat_axis(func: tirx.PrimFunc) -> int | None:
    """The axis along which `func` concatenates its inputs (in parameter order) into its last
    parameter, or None when it is not exactly that. Read from the TIR: one block writing every
    output element, a chain of selects whose leaves read the inputs, and each input's first and
    last row along the axis routed to that input at the right offset."""
    bufs = list(func.params)
    if len(bufs) < 3:
        return None
    ins, out = bufs[:-1], bufs[-1]
    try:
        shapes = [tuple(int(d) for d in b.shape) for b in bufs]
    except TypeError:
        return None
    if any(b.dtype != out.dtype or len(s) != len(shapes[-1]) for b, s in zip(bufs, shapes)):
        return None
    differ = [d for d in range(len(shapes[-1])) if any(s[d] != shapes[-1][d] for s in shapes[:-1])]
    axis = differ[0] if len(differ) == 1 else None
    if axis is None or sum(s[axis] for s in shapes[:-1]) != shapes[-1][axis]:
        return None
    blocks = _blocks(func)
    if len(blocks) != 1 or not isinstance(blocks[0].body, tirx.BufferStore):
        return None
    blk, store = blocks[0], blocks[0].body
    ivars = [iv.var for iv in blk.iter_vars]
    if (not store.buffer.same_as(out) or len(ivars) != len(shapes[-1])
            or any(not isinstance(i, tirx.Var) or not i.same_as(v) for i, v in zip(store.indices, ivars))
            or any(int(iv.dom.extent) != e for iv, e in zip(blk.iter_vars, shapes[-1]))):
        return None
    start = 0
    for buf, shape in zip(ins, shapes[:-1]):
        for row in (start, start + shape[axis] - 1):
            if not _routes(store.value, ivars, axis, row, buf, start):
                return None
        start += shape[axis]
    return axis


def _routes(expr, ivars: list, axis: int, row: int, buf, start: int) -> bool:
    """At output row `row` of the axis, `expr` reads `buf` at row - `start` (other dims unmoved)."""
    analyzer = tvm.sym.Analyzer()
    analyzer.bind(ivars[axis], tirx.const(row, str(ivars[axis].ty.dtype)))
    for _ in range(64):                                   # select chains are one level per input
        if isinstance(expr, TensorLoad):
            break
        if isinstance(expr, Call) and getattr(expr.op, "name", "") == "prim.if_then_else":
            cond, a, b = expr.args
        elif isinstance(expr, Select):
            cond, a, b = expr.condition, expr.true_value, expr.false_value
        else:
            return False
        taken = analyzer.simplify(cond)
        if not isinstance(taken, tirx.IntImm):
            return False
        expr = a if taken.value else b
    if not isinstance(expr, TensorLoad) or not expr.source.same_as(buf):
        return False
    for d, (idx, v) in enumerate(zip(expr.indices, ivars)):
        want = row - start if d == axis else v
        if not analyzer.can_prove_equal(idx, want):
            return False
    return True


def find_assemblies(graph: Graph) -> list[Assembly]:
    """The concats of `graph` whose parts can all live inside their output."""
    keep_out = set(graph.outputs) | set(graph.inputs)
    claimed: set[int] = set()
    found: list[Assembly] = []
    for i, call in enumerate(graph.calls):
        if call.n_outputs != 1:
            continue
        axis = concat_axis(graph.kernels[call.kernel])
        if axis is None:
            continue
        parts, out = call.args[:-1], call.args[-1]
        t_out = graph.tensors[out]
        deltas = _deltas(graph, parts, t_out.shape, axis)
        if (deltas is None or out in keep_out or len(set(parts)) != len(parts)
                or any(p in keep_out or p in claimed or graph.tensors[p].kind != "intermediate"
                       or not graph.tensors[p].nbytes for p in parts)):
            continue
        claimed.update(parts)
        found.append(Assembly(i, out, tuple(parts), deltas))
    return found


def _deltas(graph: Graph, parts: list[int], shape: tuple[int, ...], axis: int) -> tuple[int, ...] | None:
    """Each part's byte offset in the output, None unless each is one aligned contiguous range."""
    if any(d != 1 for d in shape[:axis]):
        return None
    deltas, at = [], 0
    for p in parts:
        if at % ALIGN:
            return None
        deltas.append(at)
        at += graph.tensors[p].nbytes
    return tuple(deltas)


def roots(assemblies: list[Assembly]) -> dict[int, tuple[int, int]]:
    """Part tensor -> (the tensor whose arena range holds it, byte offset inside it), nested
    concats resolved to the outermost one."""
    parent = {p: (a.out, d) for a in assemblies for p, d in zip(a.parts, a.deltas)}
    out: dict[int, tuple[int, int]] = {}
    for p in parent:
        root, off = p, 0
        while root in parent:
            root, d = parent[root]
            off += d
        out[p] = (root, off)
    return out
