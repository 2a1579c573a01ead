"""The reduction-epilogue CPU rule: a conv or matmul whose output is summed right away over its
channels by a memory-intensive reduction, e.g. CSRNet's last 3x3 conv (+ bias, ReLU) followed by
the 1x1 conv to one density map (global fusion makes such kernels, globalfuse/epilogue.py), or
over all its pixels (a global pool); not a pooling window that slides with the output.

The anchor (the first reduction) is tiled as the tiled-reduction rule tiles it, except that its
loops over the axes the second reduction sums (a 1x1 conv's channels; a global pool's pixels)
go inside the parallel loop: each parallel task computes whole pixels (all their channels,
through bias and ReLU) into a tile that stays in cache, then the second reduction for the same
pixels, so the anchor's output never makes a round trip through memory:

    parallel for (pixel tiles, fused)
      for (channel tiles)                          the anchor's register tiles, as tiled-reduction
        write back through the element-wise epilogue
      for (channels) for (pixels of the tile)      the tail: one accumulator per pixel
      the tail's element-wise epilogue (bias)
"""
from __future__ import annotations

from tvm import s_tir, tirx

from ..tir_util import (PARALLEL_MIN_WORK, KernelSchedule, RuleMismatch, best_factor, free_vars, is_reduction,
                       loop_extent, vector_factor)


def reduction_epilogue(rules, sch: s_tir.Schedule) -> KernelSchedule:
    """Schedule `sch` (rules: the CpuRules of the target) or raise RuleMismatch."""
    blocks = rules._blocks(sch)
    reductions = [b for b in blocks if is_reduction(sch, b)]
    if len(reductions) != 2:
        raise RuleMismatch("needs two reduction blocks")
    tail = reductions[1]
    names = [sch.get(b).name_hint for b in blocks]
    tail_name = sch.get(tail).name_hint
    post = blocks[names.index(tail_name) + 1:]
    a = rules.prepare_anchor(sch, upto=tail_name)
    summed = _summed_anchor_vars(sch, a, tail)

    vec, reg, extents = a.vec, a.reg, a.extents
    vfac = vector_factor(extents[vec[0].var], a.lanes) if vec else 1
    nvec = max(1, -(-vfac // a.lanes))
    rfac = best_factor(extents[reg[0].var], max(1, (rules.registers - 4 - nvec) // nvec)) if reg else 1
    pixels, channels, vec_inner, reg_inner = [], [], None, None
    for iv, lp in a.spatial:
        into = channels if iv.var in summed else pixels
        if vec is not None and iv.same_as(vec[0]) and vfac > 1:
            lp, vec_inner = sch.split(lp, [None, vfac])
        elif reg is not None and iv.same_as(reg[0]) and rfac > 1:
            lp, reg_inner = sch.split(lp, [None, rfac])
        into.append(lp)
    if not pixels:
        raise RuleMismatch("the second reduction sums every axis of the first: no tile of its own")
    inner = rules._split_at_periods(sch, a) + [x for x in (reg_inner, vec_inner) if x is not None]
    sch.reorder(*pixels, *channels, *inner)
    fused = sch.fuse(*pixels) if len(pixels) > 1 else pixels[0]
    tasks = loop_extent(sch, fused)
    par = tasks if a.work >= PARALLEL_MIN_WORK and tasks > 1 else 1
    if par > 1:
        sch.parallel(fused)
    rules.finish_anchor(sch, a, channels[-1] if channels else fused, vec_inner,
                        [reg_inner] if reg_inner is not None else [], init_depth=1 + len(channels))

    sch.reverse_compute_at(tail, fused, preserve_unit_loops=True)
    _accumulate_per_pixel(sch, tail)
    for b in post:
        sch.reverse_compute_at(b, fused)
    return KernelSchedule("reduction-epilogue", par, vfac if vec_inner is not None else 1,
                          rfac if reg_inner is not None else 1,
                          note=f"{sch.get(tail).name_hint} summed per pixel tile" + (f"; {a.note}" if a.note else ""))


def _summed_anchor_vars(sch: s_tir.Schedule, a, tail) -> set:
    """The anchor's iterators over the output axes the tail sums; raises RuleMismatch unless
    the tail reads the anchor's output (through element-wise blocks of the same shape) alone."""
    anchor = sch.get(a.block)
    out = anchor.writes[0].source
    chain = sch.get(a.consumers[-1]).writes[0].source if a.consumers else out
    if [int(d) for d in chain.shape] != [int(d) for d in out.shape]:
        raise RuleMismatch("the first reduction's epilogue changes its shape")
    blk = sch.get(tail)
    reads = [r for r in blk.reads if r.source.same_as(chain)]
    if len(reads) != 1:
        raise RuleMismatch("the second reduction does not read the first's output")
    reduce_vars = {iv.var for iv in blk.iter_vars                 # a 1x1 conv's unit kernel loops sum nothing
                   if iv.iter_type == tirx.IterVar.CommReduce and int(iv.dom.extent) > 1}
    dims = [d for d, rg in enumerate(reads[0].region) if free_vars(rg.min) & reduce_vars]
    if not dims:
        raise RuleMismatch("the second reduction does not sum the first's output")
    spatial_vars = {iv.var for iv in blk.iter_vars if iv.iter_type == tirx.IterVar.DataPar}
    if any(free_vars(reads[0].region[d].min) & spatial_vars for d in dims):
        # a window that slides with the output (max pool 2x2/2): reverse_compute_at bounds its
        # reduction from the producer's region and, when that region is not a whole number of
        # windows (225 rows under 112 windows of 2), cut the window to one row: wrong answers
        raise RuleMismatch("the second reduction slides a window over the first's output")
    summed = set()
    for d in dims:
        summed |= free_vars(anchor.writes[0].region[d].min)
    return summed


def _accumulate_per_pixel(sch: s_tir.Schedule, tail) -> None:
    """The tail's reduction loops outside its pixel loops: one accumulator per pixel of the tile,
    independent adds (a dot product per pixel is one dependent chain, 4 cycles per add)."""
    blk = sch.get(tail)
    loops = sch.get_loops(tail)
    ivs = blk.iter_vars
    mine = loops[len(loops) - len(ivs):]                   # compute_at kept one loop per iterator
    spatial = [lp for iv, lp in zip(ivs, mine) if iv.iter_type == tirx.IterVar.DataPar]
    reduce_ = [lp for iv, lp in zip(ivs, mine) if iv.iter_type == tirx.IterVar.CommReduce]
    sch.reorder(*reduce_, *spatial)
    sch.decompose_reduction(tail, reduce_[0])
