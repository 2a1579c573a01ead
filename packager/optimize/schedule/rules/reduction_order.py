"""The order of a tiled reduction's loops inside one task.

A KxK conv over NCHWc reads data[.., y + ry, x + rx, rci] and w[.., ry, rx, rci, ov], and
legalization orders its reduction rco, rci, ry, rx: the innermost loop is 3 long and every step
jumps to another weight row. Moving the input channels innermost (and unrolling them by
CONTIGUOUS_UNROLL) makes successive broadcasts come from one cache line and the weight one
stream. Used by the rule-based schedule (rules/cpu.py) and Gensor's CPU lowering (gensor/cpu_lower.py).
"""
from __future__ import annotations

from tvm import s_tir

from ..tir_util import Anchor, free_vars, loop_extent

CONTIGUOUS_UNROLL = 4


def contiguous_reduction_last(blk, reduce_: list, vec, extents: dict) -> tuple[list, bool]:
    """The reduction iterator that walks the broadcast operand's contiguous (innermost) axis,
    moved innermost (ResNet's 3x3 convs, with the loop unrolled by 4, caches flushed: 64 channels
    at 56x56 0.496 -> 0.474 ms, 256 at 14x14 0.569 -> 0.473 ms). Returns the new order and
    whether a loop longer than 1 was inside it before (a KxK conv's; a 1x1 conv's channels pass
    only loops of length 1)."""
    if vec is None:
        return reduce_, False
    for r in blk.reads:
        if not r.region or r.source.same_as(blk.writes[0].source):
            continue
        if vec[0].var in set().union(*[free_vars(rg.min) for rg in r.region]):
            continue                                   # the vector operand
        inner = [s for s in reduce_ if s[0].var in free_vars(r.region[-1].min)]
        if len(inner) == 1:
            after = reduce_[reduce_.index(inner[0]) + 1:]
            return [s for s in reduce_ if s is not inner[0]] + inner, any(extents[s[0].var] > 1 for s in after)
    return reduce_, False


def unroll_contiguous(sch: s_tir.Schedule, a: Anchor, loops: list) -> tuple[list, list]:
    """`loops` (the reduction loops inside a task, innermost last) with the innermost split by
    CONTIGUOUS_UNROLL and its inner part unrolled, when it walks the channels that
    `contiguous_reduction_last` moved there (a KxK conv's): LLVM leaves a 32-long loop
    rolled, and each step then pays its loop and address arithmetic. Returns (reduction
    loops, loops to unroll)."""
    if not a.contiguous_reduction or not loops:
        return loops, []
    n = loop_extent(sch, loops[-1])
    if n <= CONTIGUOUS_UNROLL or n % CONTIGUOUS_UNROLL:
        return loops, []
    o, i = sch.split(loops[-1], [None, CONTIGUOUS_UNROLL])
    return loops[:-1] + [o, i], [i]
