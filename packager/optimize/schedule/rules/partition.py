"""Injective kernels whose value picks an input by position (a concat fused with the slices and
activations around it, a padding stage): the loops are cut where the pick changes, so each part
reads one input through plain indices. Left whole, every vector lane computes every branch of
the select chain and gathers its operands: YOLO11n's head (three scales concatenated, sliced and
passed through a sigmoid, 84 x 2100) ran 1.8-3.5 ms vectorized by 7; cut into 9 parts,
vectorized by 4 (a width that divides every part) and parallel over the 80 class rows it runs
0.14-0.19 ms (AVX2 EPYC, 2 threads).

The innermost loop is split first by a vector width that divides the length of each of its
parts, then every axis with cut points is partitioned (TVM's loop_partition: each part a loop
of its own range, where the simplifier folds the select away).
"""
from __future__ import annotations

import math

import tvm_ffi
from tvm import s_tir
from tvm.ir.expr import Call, TensorLoad
from tvm.ir.prim.expr import GE, GT, LE, LT, And, IntImm, Or, Select

from ..tir_util import free_vars

MAX_PARTS = 16             # more parts than this: code size grows past what the select costs
MIN_VECTOR = 4             # a narrower common width is not worth a vector loop


def cut_points(value, ivars: list, extents: list[int]) -> dict[int, list[int]]:
    """Axis -> positions (inside the axis) where a select in `value` changes its answer: its
    conditions compare one block iterator with a constant (`c <= v`, `v < c`, ...)."""
    conds: list = []

    def visit(n) -> None:
        if isinstance(n, Call) and getattr(n.op, "name", "") == "prim.if_then_else":
            conds.append(n.args[0])
        elif isinstance(n, Select):
            conds.append(n.condition)

    tvm_ffi.structural_walk(value, ((Call, Select), visit), order="post")
    cuts: dict[int, set[int]] = {}
    while any(isinstance(c, (And, Or)) for c in conds):          # a pad's 1 <= y && y < 57
        conds = [x for c in conds for x in ((c.a, c.b) if isinstance(c, (And, Or)) else (c,))]
    for c in conds:
        if not isinstance(c, (LE, LT, GE, GT)):
            continue
        for d, v in enumerate(ivars):
            if isinstance(c.b, IntImm) and c.a.same_as(v):          # v < c, v <= c, v >= c, v > c
                at = int(c.b.value) + (1 if isinstance(c, (LE, GT)) else 0)
            elif isinstance(c.a, IntImm) and c.b.same_as(v):        # c <= v, c < v, ...
                at = int(c.a.value) + (1 if isinstance(c, (LT, GE)) else 0)
            else:
                continue
            if 0 < at < extents[d]:
                cuts.setdefault(d, set()).add(at)
    return {d: sorted(p) for d, p in cuts.items()}


def partition_selects(sch: s_tir.Schedule, block, lanes: int, min_work: int) -> tuple[int, int, int] | None:
    """Cut `block`'s loops at its select positions, vectorize and parallelize each part;
    (parallel extent, vector width, parts), or None when the block has no such select, its
    loops are not its iterators one to one, no vector width of MIN_VECTOR or more divides its
    innermost parts, or it would take more than MAX_PARTS parts (the plain rule takes it)."""
    stmt = sch.get(block)
    loops = sch.get_loops(block)
    ivars = [iv.var for iv in stmt.iter_vars]
    extents = [int(iv.dom.extent) for iv in stmt.iter_vars]
    if not _loops_are_iterators(sch, block):
        return None
    cuts = cut_points(stmt.body.value, ivars, extents)
    inner = len(extents) - 1
    edges = [0, *cuts.get(inner, []), extents[inner]]
    vec = math.gcd(lanes, *[b - a for a, b in zip(edges, edges[1:])])
    if vec < MIN_VECTOR:                  # parts of the innermost axis too short for a vector:
        cuts.pop(inner, None)             # keep it whole (a pad's one-element borders)
        vec = math.gcd(lanes, extents[inner])
    if not cuts or vec < MIN_VECTOR or math.prod(len(p) + 1 for p in cuts.values()) > MAX_PARTS:
        return None
    if inner in cuts:
        cuts[inner] = [c // vec for c in cuts[inner]]
    sizes = [*extents[:-1], extents[-1] // vec, vec]   # the loops after the vector split, lanes last
    lead = next((d for d in range(len(sizes) - 1) if sizes[d] > 1), None)
    if lead is not None and _loses_threads(sizes, lead, cuts.get(lead), min_work):
        return None
    _, lane = sch.split(loops[-1], [None, vec])
    sch.vectorize(lane)
    parts, par = [block], 1
    for d in range(len(sizes) - 1):                    # outermost first: the parallel loop is cut first
        nxt = []
        for b in parts:
            lp = sch.get_loops(b)[d - len(sizes)]
            pieces = sch.loop_partition(lp, [cuts[d][0], *[y - x for x, y in zip(cuts[d], cuts[d][1:])], None]) \
                if d in cuts else [lp]
            for piece in pieces:
                n = int(sch.get(piece).extent)
                if d == lead and n > 1 and n * math.prod(sizes[d + 1:]) >= min_work:
                    sch.parallel(piece)
                    par = max(par, n)
                nxt += list(sch.get_child_blocks(piece)) if d in cuts else [b]
        parts = nxt
    return par, vec, len(parts)


def _loses_threads(sizes: list[int], lead: int, cuts: list[int] | None, min_work: int) -> bool:
    """Enough work for threads, but no part of the outermost loop big enough to share out."""
    inside = math.prod(sizes[lead + 1:])
    if sizes[lead] * inside < min_work or not cuts:
        return False
    edges = [0, *cuts, sizes[lead]]
    return not any(b - a > 1 and (b - a) * inside >= min_work for a, b in zip(edges, edges[1:]))


def _loops_are_iterators(sch: s_tir.Schedule, block) -> bool:
    """Whether `block`'s loops are its iterators one to one (same extents, bound as they are)."""
    stmt, loops = sch.get(block), sch.get_loops(block)
    return (len(loops) == len(stmt.iter_vars)
            and all(int(sch.get(lp).extent) == int(iv.dom.extent) for lp, iv in zip(loops, stmt.iter_vars))
            and all(sch.get(lp).loop_var.same_as(b) for lp, b in zip(loops, _bindings(sch, block))))


def _bindings(sch: s_tir.Schedule, block) -> list:
    """The expressions the block's iterators are bound to (its realize's iter values)."""
    found: list = []
    tvm_ffi.structural_walk(sch.mod["main"].body, (s_tir.SBlockRealize, found.append), order="post")
    name = sch.get(block).name_hint
    return next((list(r.iter_values) for r in found if r.block.name_hint == name), [])


def varies_per_outer(sch: s_tir.Schedule, block, k: int) -> bool:
    """Whether a vector over `block`'s loops from the k-th on, were it to take in the loop before
    too, would gather: the value loads a buffer at an index of outer iterators only (a
    per-channel constant) or picks by a condition on an outer iterator (a concat). False when
    the loops are not the block's iterators one to one."""
    if not _loops_are_iterators(sch, block):
        return False
    stmt = sch.get(block)
    ivars = [iv.var for iv in stmt.iter_vars]
    outer, inner = ivars[:k], ivars[k:]

    def uses(expr, group) -> bool:
        return any(v.same_as(g) for v in free_vars(expr) for g in group)

    hits: list = []

    def visit(n) -> None:
        if isinstance(n, TensorLoad):
            if any(uses(i, outer) for i in n.indices) and not any(uses(i, inner) for i in n.indices):
                hits.append(n)
        elif isinstance(n, Select) and uses(n.condition, outer):
            hits.append(n)
        elif isinstance(n, Call) and getattr(n.op, "name", "") == "prim.if_then_else" and uses(n.args[0], outer):
            hits.append(n)

    tvm_ffi.structural_walk(stmt.body, ((TensorLoad, Select, Call), visit), order="post")
    return bool(hits)
