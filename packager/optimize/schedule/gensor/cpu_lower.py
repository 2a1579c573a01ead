"""A CPU tile plan -> loop nest (s_tir.Schedule), on a kernel prepared by the rule-based pass's
`prepare_anchor` (padding staged, producers inlined, strided inputs de-interleaved):

    parallel for (spatial L2 tiles, fused)           one task per core-sized tile
      for (reduction chunks)                         operands of a chunk stay in L1
        for (spatial L1 tiles) for (register tiles)  (order chunks-inner: L1 tiles, then chunks)
          for (reduction inside the chunk)            a KxK conv's input channels innermost, unrolled by 4
            register tile: unrolled rows x vectorized lanes (accumulators in registers)
      write back the task's accumulators through the element-wise epilogue
    (a padding stage: one parallel pass before, per task, or inlined into the reads: the plan says)
"""
from __future__ import annotations

from tvm import s_tir

from ..rules.reduction_order import unroll_contiguous
from ..rules.cpu import CpuRules
from ..tir_util import PARALLEL_MIN_WORK, Anchor, loop_extent
from ..rules.padding import offers_inline, offers_per_task, pad_inline
from .plan import ORDERS, PADS, TilePlan


def lower_cpu(sch: s_tir.Schedule, rules: CpuRules, anchor: Anchor, plan: TilePlan) -> int:
    """Apply `plan` to the prepared anchor in `sch`; returns the parallel extent."""
    plan.check()
    if plan.pad != PADS[0] and not offers_per_task(anchor):
        raise ValueError(f"pad {plan.pad}: the kernel has no padding stage worth tiling")
    if plan.pad == PADS[2]:
        if not offers_inline(sch, anchor):
            raise ValueError("pad inline: the vector lanes do not share one bounds test, or the padding "
                             "stage gathers them (padding.offers_inline)")
        anchor = pad_inline(sch, anchor)
    index = {name: d for d, name in enumerate(plan.axes)}
    outer, chunk, mid, inner, reg, vec_inner = [], [], [], [], [], None
    for iv, lp in anchor.spatial:
        d = index[iv.var.name]
        t2, t1, t0 = plan.tiles[d]
        o, m, i, r = sch.split(lp, [plan.extents[d] // t2, t2 // t1, t1 // t0, t0])
        outer.append(o)
        mid.append(m)
        inner.append(i)
        if d == plan.vector_axis:
            vec_inner = r
        else:
            reg.append(r)
    red_inner = []
    for iv, lp in anchor.reduce:
        d = index[iv.var.name]
        c, i = sch.split(lp, [plan.extents[d] // plan.tile(d, "L1"), plan.tile(d, "L1")])
        chunk.append(c)
        red_inner.append(i)
    red_inner, unrolled = unroll_contiguous(sch, anchor, red_inner)
    one_chunk = all(loop_extent(sch, c) == 1 for c in chunk)      # then inside the register tiles' loops
    middle = mid if one_chunk else [*chunk, *mid] if plan.order == ORDERS[0] else [*mid, *chunk]
    sch.reorder(*outer, *middle, *inner, *(chunk if one_chunk else []), *red_inner, *reg,
                *([vec_inner] if vec_inner is not None else []))
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    tasks = int(sch.get(fused).extent)
    par = tasks if anchor.work >= PARALLEL_MIN_WORK and tasks > 1 else 1
    if par > 1:
        sch.parallel(fused)
    acc_at = inner[-1] if one_chunk and inner else None
    rules.finish_anchor(sch, anchor, fused, vec_inner, reg + unrolled, pad_per_task=plan.pad == PADS[1], acc_at=acc_at)
    return par
