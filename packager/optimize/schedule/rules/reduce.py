"""The vector row-reduction CPU rule: softmax, layer norm, RMS norm with vector partial sums.

dlight's CPU reduction rule (the fallback after this one) leaves each row's sum a scalar chain:
without fast-math LLVM may not reorder a float sum, so one add waits for the previous (4 cycles
each), and a 768-wide layer norm took 70 us on 128 rows. Here every reduction along a row whose
length is a multiple of the vector width is first split into `lanes` partial sums (rfactor), a
vector accumulator the row's elements stream into, then summed across its lanes once per row:

    parallel for (rows)                             the leading spatial axes, fused
      for (chunks of lanes) partial[lane] += x      one vector add per chunk
      total = sum(partial)                          lanes scalar adds per row
      element-wise blocks vectorized along the row

Same 128 x 768 layer norm: 7.7 us. The sum's order changes (lane-wise, then across lanes), as in
any vectorized reduction; the verify tolerance covers it. A row that is not whole vectors long
keeps scalar sums (rfactor cannot split it) but the same structure: dlight's rule, given one
row (a classifier's 1 x 1000 softmax), computed the row's max and sum once per output element,
1.4 ms instead of microseconds.
"""
from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx

from ..tir_util import KernelSchedule, RuleMismatch, free_vars, is_reduction, loop_extent, vectorize_inner


def vector_row_reduction(rules, sch: s_tir.Schedule) -> KernelSchedule:
    """Schedule `sch` (rules: the CpuRules of the target) or raise RuleMismatch."""
    blocks = rules._blocks(sch)
    if len(blocks) < 2 or is_reduction(sch, blocks[-1]) or not any(is_reduction(sch, b) for b in blocks):
        raise RuleMismatch("needs reductions followed by an element-wise block")
    lead = min(_leading_spatial(sch, b) for b in blocks)
    if lead == 0:
        raise RuleMismatch("blocks share no leading spatial axis")
    if any(rules._scatters(sch, b) for b in blocks[:-1]):
        # computed at the row loop over a region TVM derives wrongly: a padded conv's channels
        # taken back after a global pool left 8 of 1000 softmax inputs unwritten (squeezenet)
        raise RuleMismatch("a block stores at a computed index")
    lanes = rules.lanes(rules._dtype_bits(sch, blocks[-1]))
    reductions = [b for b in blocks if is_reduction(sch, b)]
    partials = row_partials(sch, [b for b in reductions if _leading_spatial(sch, b) == lead], lanes)
    if not partials and not all(_reduces_last_axis(sch, b, lead) for b in reductions):
        raise RuleMismatch("no reduction along the rows' innermost axis")

    blocks = rules._blocks(sch)
    last = blocks[-1]
    loops = sch.get_loops(last)
    rows = sch.fuse(*loops[:lead]) if lead > 1 else loops[0]
    n_rows = loop_extent(sch, rows)
    if n_rows > 1:
        sch.parallel(rows)
    vectorize_inner(sch, last, lanes)
    for b in reversed(blocks[:-1]):
        sch.compute_at(b, rows, preserve_unit_loops=True)
    vectorize_partials(sch, partials)
    for b in blocks[:-1]:
        vectorize_inner(sch, b, lanes)
    return KernelSchedule("vector-row-reduction", n_rows, lanes,
                          note=f"{len(partials)} reduction(s) as {lanes}-lane partial sums" if partials else
                          "row sums as scalar chains (rows not whole vectors long)")


def row_partials(sch: s_tir.Schedule, blocks: list, lanes: int) -> list:
    """Split each of `blocks` that reduces its rows over one innermost loop a whole number of
    vectors long into lane-wise partial sums (before any compute_at: rfactor needs the block's own
    loop nest); the partial blocks, to pass to vectorize_partials once they are placed."""
    return [rf for b in blocks if (rf := _vector_partials(sch, b, _leading_spatial(sch, b), lanes))]


def vectorize_partials(sch: s_tir.Schedule, partials: list) -> None:
    """After compute_at: the partial blocks' lane loop innermost and vectorized, their zeroing
    apart. compute_at makes loops in iterator order, which puts the lane iterator first."""
    for rf in partials:
        lane, chunks = _loop_of(sch, rf, 0), _loop_of(sch, rf, -1)
        sch.reorder(chunks, lane)
        sch.vectorize(lane)
        sch.decompose_reduction(rf, sch.get_loops(rf)[1])


def _loop_of(sch: s_tir.Schedule, block, index: int):
    """The loop that binds the block's iterator `index`."""
    blk = sch.get(block)
    realizes: list = []
    tvm_ffi.structural_walk(sch.mod["main"].body,
                            (s_tir.SBlockRealize, lambda r: realizes.append(r) if r.block.same_as(blk) else None),
                            order="post")
    used = free_vars(realizes[0].iter_values[index])
    for lp in sch.get_loops(block):
        if sch.get(lp).loop_var in used:
            return lp
    raise RuleMismatch(f"no loop binds iterator {index} of {blk.name_hint}")


def _reduces_last_axis(sch: s_tir.Schedule, block, lead: int) -> bool:
    """`lead` spatial iterators then one reduction that reads along the innermost index of a
    buffer (a softmax or layer norm row), not across it (a pooling over NCHW16c)."""
    ivs = sch.get(block).iter_vars
    if len(ivs) != lead + 1 or ivs[-1].iter_type != tirx.IterVar.CommReduce:
        return False
    return any(r.region and r.region[-1].min.same_as(ivs[-1].var) for r in sch.get(block).reads)


def _leading_spatial(sch: s_tir.Schedule, block) -> int:
    n = 0
    for iv in sch.get(block).iter_vars:
        if iv.iter_type != tirx.IterVar.DataPar:
            break
        n += 1
    return n


def _vector_partials(sch: s_tir.Schedule, block, lead: int, lanes: int):
    """rfactor a reduction over the innermost loop alone into `lanes` partial sums; the partial
    block (chunks outer, lanes inner) or None when the row is not whole vectors long."""
    loops = sch.get_loops(block)
    ivs = sch.get(block).iter_vars
    if len(loops) != len(ivs) or len(ivs) != lead + 1 or ivs[-1].iter_type != tirx.IterVar.CommReduce:
        return None
    n = loop_extent(sch, loops[-1])
    if n % lanes or n < 2 * lanes:
        return None
    _, lane = sch.split(loops[-1], [None, lanes])
    return sch.rfactor(lane, lead)

