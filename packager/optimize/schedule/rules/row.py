"""The row-region CPU rule: a kernel whose last reduction (a matmul) reads the results of other
reductions computed along the same rows, e.g. softmax fused into the attention matmul P @ V
(global fusion makes such kernels).

The anchor (the last reduction) is tiled like the tiled-reduction rule: a register tile of rows
x whole vectors of the output's innermost axis; its leading row axes (batch, head, row tile) are
fused into one parallel loop, and every earlier block that is not cheap to recompute (the other
reductions, exp) is computed under that loop for the rows of the tile only, so its intermediate
is a tile-sized buffer that stays in cache: one parallel region per row block, no round trip of
the score matrix through memory. Cheap element-wise producers (copies, one arithmetic op) are
inlined where they are read. The row sums among them (softmax's max and sum, layer norm's mean
and variance) run as vector partial sums, as in the vector row-reduction rule.
"""
from __future__ import annotations

from tvm import s_tir, tirx

from ...kernel_cost import float_ops
from .reduce import row_partials, vectorize_partials
from ..tir_util import (KernelSchedule, RuleMismatch, best_factor, free_vars, has_if_then_else, is_reduction,
                       loop_extent, vector_factor, vectorize_inner)

CHEAP_OPS = 2                  # element-wise blocks with at most this many float ops are inlined


def row_region(rules, sch: s_tir.Schedule) -> KernelSchedule:
    """Schedule `sch` (rules: the CpuRules of the target) or raise RuleMismatch."""
    blocks = rules._blocks(sch)
    reductions = [b for b in blocks if is_reduction(sch, b)]
    if len(reductions) < 2:
        raise RuleMismatch("needs two or more reduction blocks")
    anchor = reductions[-1]
    names = [sch.get(b).name_hint for b in blocks]
    pos = names.index(sch.get(anchor).name_hint)
    producers, consumers = blocks[:pos], blocks[pos + 1:]
    if any(is_reduction(sch, b) for b in consumers):
        raise RuleMismatch("a reduction after the anchor")
    staged = _inline_cheap(sch, producers, sch.get(anchor))
    staged, partials = _with_partials(rules, sch, staged, sch.get(anchor))
    if any(rules._scatters(sch, b) for b in staged):
        raise RuleMismatch("a block stores at a computed index (computed at the row region over a wrong region)")

    blk = sch.get(anchor)
    loops = sch.get_loops(anchor)
    iters = list(zip(blk.iter_vars, loops))
    if len(loops) != len(blk.iter_vars) or len(blk.reads) < 2:
        raise RuleMismatch("anchor is not a matmul-like block")
    spatial = [(iv, lp) for iv, lp in iters if iv.iter_type == tirx.IterVar.DataPar]
    reduce_ = [lp for iv, lp in iters if iv.iter_type == tirx.IterVar.CommReduce]
    if [iv.iter_type for iv, _ in iters] != sorted(iv.iter_type for iv, _ in iters) or len(spatial) < 2:
        raise RuleMismatch("anchor loops are not spatial-then-reduce")
    (vec_iv, vec_loop), (row_iv, row_loop) = spatial[-1], spatial[-2]
    if not _is_matmul(blk, row_iv.var, vec_iv.var):
        raise RuleMismatch("anchor is not a matmul: rows and columns must each skip one operand")
    _check_column_operand_fits(rules.target, blk, row_iv.var, [iv for iv, _ in spatial[:-2]])
    lanes = rules.lanes(blk.writes[0].source.dtype.bits)
    vec_ext, row_ext = loop_extent(sch, vec_loop), loop_extent(sch, row_loop)
    vfac = vector_factor(vec_ext, lanes)
    nvec = max(1, -(-vfac // lanes))
    want = max(1, (rules.registers - 4 - nvec) // nvec)
    rfac = best_factor(row_ext, want)
    if 2 * rfac <= want < row_ext:     # awkward rows (ViT's 197): whole tiles and a predicated last one
        rfac = want
    row_o, row_i = sch.split(row_loop, [None, rfac])
    vec_o, vec_i = sch.split(vec_loop, [None, vfac])
    outer = [lp for _, lp in spatial[:-2]] + [row_o]
    sch.reorder(*outer, vec_o, *reduce_, row_i, vec_i)
    region = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    n_tiles = loop_extent(sch, region)
    if n_tiles > 1:                    # before compute_at: TVM checks parallel loops block by block
        sch.parallel(region)

    writeback = sch.cache_write(anchor, 0, "local")
    sch.reverse_compute_at(writeback, vec_o)
    for c in consumers[:-1]:
        sch.compute_inline(c)
    if consumers:
        sch.reverse_compute_inline(consumers[-1])
    for b in reversed(staged):                        # each producer's rows, under the row loop
        sch.compute_at(b, region)
    vectorize_partials(sch, partials)
    for b in staged:
        vectorize_inner(sch, b, lanes)
    wb = sch.get_loops(writeback)[-1]
    if loop_extent(sch, wb) % lanes == 0:
        sch.vectorize(sch.split(wb, [None, lanes])[1] if loop_extent(sch, wb) > lanes else wb)
    sch.unroll(row_i)
    sch.vectorize(vec_i)
    sch.decompose_reduction(anchor, vec_o)
    for b in staged:
        if not any(sch.get(b).same_as(sch.get(rf)) for rf in partials):
            _tile_staged_matmul(sch, b, lanes, rfac)
    note = f"{len(staged)} block(s) computed per row tile"
    return KernelSchedule("row-region", n_tiles if n_tiles > 1 else 1, vfac, rfac,
                          note=note + (f", {len(partials)} row sum(s) in vector partial sums" if partials else ""))


def _with_partials(rules, sch: s_tir.Schedule, staged: list, anchor) -> tuple[list, list]:
    """The staged row reductions (a softmax's max and sum, a layer norm's mean and variance:
    outputs of lower rank than the anchor's) as vector partial sums (rules_reduce.py); the staged
    list with each partial block before the block that sums it, and the partial blocks."""
    rank = len(anchor.writes[0].source.shape)
    rows = [b for b in staged if is_reduction(sch, b) and len(sch.get(b).writes[0].source.shape) < rank]
    partials = row_partials(sch, rows, rules.lanes(anchor.writes[0].source.dtype.bits))
    by_name = {sch.get(rf).name_hint: rf for rf in partials}
    ordered = []
    for b in staged:
        rf = by_name.get(sch.get(b).name_hint + "_rf")
        ordered += [rf, b] if rf is not None else [b]
    return ordered, partials


def _check_column_operand_fits(target, blk, row_var, outer_ivs: list) -> None:
    """The resource limit of a row region (Souffle's partitioning, CPU form): every row tile
    streams the whole column operand (V of one head, a projection's weights), so it must stay in
    half of a core's L2 or the region re-reads it from DRAM once per row tile (measured 3x slower
    on ViT's 192x576 QKV weights)."""
    from ..hardware import cpu_hardware

    budget = cpu_hardware(target).level("L2").capacity // 2
    for rd in blk.reads:
        used = set().union(*[free_vars(r.min) for r in rd.region])
        if row_var in used or rd.source.same_as(blk.writes[0].source):
            continue
        size = rd.source.dtype.bits // 8
        for d in rd.source.shape:
            size *= int(d)
        for iv in outer_ivs:                       # one slice per batch / head
            if iv.var in used:
                size //= max(int(iv.dom.extent), 1)
        if size > budget:
            raise RuleMismatch(f"column operand {rd.source.name} ({size // 1024} KB per row tile) does not "
                               f"fit half the L2 ({budget // 1024} KB)")


def _is_matmul(blk, row_var, col_var) -> bool:
    """Two operands: one indexed by the row but not the column, one by the column but not the row."""
    used = [set().union(*[free_vars(r.min) for r in rd.region]) for rd in blk.reads
            if not rd.source.same_as(blk.writes[0].source)]
    return (any(row_var in u and col_var not in u for u in used)
            and any(col_var in u and row_var not in u for u in used))


def _inline_cheap(sch: s_tir.Schedule, producers: list, anchor) -> list:
    """Inline copies, and one-op element-wise producers the anchor does not read (inside the
    matmul's inner loop even one op per element costs once per column tile); return the blocks
    left to stage."""
    staged = []
    anchor_reads = [r.source for r in anchor.reads]
    for b in producers:
        block = sch.get(b)
        ops = float_ops(block.body.value) if isinstance(block.body, tirx.BufferStore) else CHEAP_OPS + 1
        read_by_anchor = any(block.writes[0].source.same_as(s) for s in anchor_reads)
        cheap = (not is_reduction(sch, b) and ops <= (0 if read_by_anchor else CHEAP_OPS)
                 and not has_if_then_else(block.body))
        if cheap:
            try:
                sch.compute_inline(b)
                continue
            except Exception:  # noqa: BLE001 - e.g. written in several places: stage it instead
                pass
        staged.append(b)
    return staged


def _tile_staged_matmul(sch: s_tir.Schedule, block, lanes: int, rows: int) -> None:
    """A matmul computed per row tile (Q @ K^T before the softmax in an attention row region):
    its reduction goes outside a register tile of the tile's rows x whole vectors of columns, as
    the anchor's (scalar dot products otherwise: 10x slower). Other reductions (a softmax's max
    and sum) keep their row loops."""
    blk = sch.get(block)
    loops = sch.get_loops(block)
    ivs = blk.iter_vars
    if (len(blk.reads) < 2 or len(loops) < 3 or len(ivs) < 3 or ivs[-1].iter_type != tirx.IterVar.CommReduce
            or ivs[-2].iter_type != tirx.IterVar.DataPar):
        return
    row, col, red = loops[-3:]
    if (loop_extent(sch, row) != rows or loop_extent(sch, col) != int(ivs[-2].dom.extent)
            or loop_extent(sch, red) != int(ivs[-1].dom.extent) or not _is_matmul(blk, ivs[-3].var, ivs[-2].var)):
        return
    vfac = vector_factor(loop_extent(sch, col), lanes)
    if vfac < lanes:
        return
    col_o, col_i = sch.split(col, [None, vfac])
    sch.reorder(col_o, red, row, col_i)
    sch.unroll(row)
    sch.vectorize(col_i)
    sch.decompose_reduction(block, col_o)

