"""The column-reduction CPU rule: softmax (or any reductions plus an element-wise tail) over an
axis that is not the innermost one, e.g. YOLOv8's distribution head, a softmax over axis 1 of
(1, 16, 4, 8400).

The row rule fuses the leading axes into rows, which here include the reduced axis: every
row's max and sum were computed again for each of the 16 positions of that axis. Here the
innermost axis (contiguous in memory) gives the vector lanes and the reduced axis is a loop
around them, so each max and sum is a vector of independent columns:

    parallel for (other axes, inner axis / lanes)
      for (reduced axis) acc[lanes] = max(acc, x[.., k, .., lanes])     one vector op per k
      ... the element-wise blocks over (reduced axis, lanes)
"""
from __future__ import annotations

from tvm import s_tir, tirx

from ..tir_util import KernelSchedule, RuleMismatch, is_reduction, loop_extent, vector_factor


def column_reduction(rules, sch: s_tir.Schedule) -> KernelSchedule:
    """Schedule `sch` (rules: the CpuRules of the target) or raise RuleMismatch."""
    blocks = rules._blocks(sch)
    reductions = [b for b in blocks if is_reduction(sch, b)]
    if len(blocks) < 2 or not reductions or is_reduction(sch, blocks[-1]):
        raise RuleMismatch("needs reductions followed by an element-wise block")
    if any(rules._scatters(sch, b) for b in blocks[:-1]):
        raise RuleMismatch("a block stores at a computed index (computed at the columns over a wrong region)")
    last = blocks[-1]
    loops = sch.get_loops(last)
    rank = len(sch.get(last).iter_vars)
    if len(loops) != rank or rank < 2:
        raise RuleMismatch("the last block's loops are not its iterators")
    axis = _reduced_axis(sch, reductions, rank)
    lanes = rules.lanes(rules._dtype_bits(sch, last))
    n = loop_extent(sch, loops[-1])
    vf = vector_factor(n, lanes)
    if n % vf or vf < 4:
        raise RuleMismatch(f"innermost extent {n} gives no whole vectors")
    outer_inner, lane = sch.split(loops[-1], [None, vf])
    others = [lp for i, lp in enumerate(loops[:-1]) if i != axis]
    sch.reorder(*others, outer_inner, loops[axis], lane)
    columns = sch.fuse(*others, outer_inner)
    if loop_extent(sch, columns) > 1:
        sch.parallel(columns)
    sch.vectorize(lane)
    for b in reductions:                       # the reduced iterator outside the columns' lanes
        sch.reorder_block_iter_var(b, [*range(rank - 2), rank - 1, rank - 2])
    for b in reversed(blocks[:-1]):
        sch.compute_at(b, columns, preserve_unit_loops=True)
    for b in blocks[:-1]:
        _vectorize_under(sch, b, vf)
    return KernelSchedule("column-reduction", loop_extent(sch, columns), vf,
                          note=f"{len(reductions)} reduction(s) over axis {axis} as {vf}-lane columns")


def _reduced_axis(sch: s_tir.Schedule, reductions: list, rank: int) -> int:
    """The output axis every reduction reduces (one reduce iterator after rank - 1 spatial ones,
    read at that position of a rank-`rank` buffer whose innermost index is the innermost spatial
    iterator); not the innermost axis."""
    axes = set()
    for b in reductions:
        blk = sch.get(b)
        ivs = blk.iter_vars
        if len(ivs) != rank or ivs[-1].iter_type != tirx.IterVar.CommReduce or \
                any(iv.iter_type != tirx.IterVar.DataPar for iv in ivs[:-1]):
            raise RuleMismatch(f"{blk.name_hint}: not {rank - 1} spatial iterators and one reduction")
        found = None
        for region in blk.reads:
            idx = [r.min for r in region.region]
            if len(idx) == rank and idx[-1].same_as(ivs[-2].var):
                hits = [i for i, e in enumerate(idx) if e.same_as(ivs[-1].var)]
                found = hits[0] if len(hits) == 1 else found
        if found is None:
            raise RuleMismatch(f"{blk.name_hint}: no read with the reduced axis among contiguous columns")
        axes.add(found)
    if len(axes) != 1 or (axis := axes.pop()) == rank - 1:
        raise RuleMismatch("the reductions run along the innermost axis (the row rules' kind)")
    return axis


def _vectorize_under(sch: s_tir.Schedule, block, vf: int) -> None:
    """After compute_at: the block's innermost loop (the lanes: a reduction's iterator was moved
    before them) vectorized, a reduction's zeroing apart."""
    loops = sch.get_loops(block)[1:]
    if not loops or loop_extent(sch, loops[-1]) != vf:
        raise RuleMismatch(f"{sch.get(block).name_hint}: its innermost loop is not the {vf} lanes")
    sch.vectorize(loops[-1])
    if is_reduction(sch, block):
        sch.decompose_reduction(block, loops[-2])
