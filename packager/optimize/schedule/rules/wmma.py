"""wmma tensor-core matmul schedules whose block tile is sized to the matmul.

dlight's tensor-core rule gives every matmul one 128x128 tile of 16 warps, so at batch 1 a
transformer's 128-row matmuls ran as a handful of blocks on a 132-SM GPU, slower than fp32 on CUDA
cores (docs/gpu-results.md). Here the tile is a choice: warps per block along M and N, 16x16
fragments per warp, and K fragments per pipeline stage. `tiles` orders the candidates by an
estimate of time on the target's SMs (`estimate`): small matmuls spread over many SMs, large ones
keep big tiles for reuse. The schedule is the standard wmma pipeline, written with TVM's
primitives and dlight's matmul helpers: normalise to C[S, I, J] += A[S, I, K] * B[S, J, K], pad to
the tile, stage A and B through dynamic shared memory with a two-stage software pipeline, load
fragments, mma into an fp32 accumulator, stage it through shared memory and inline the epilogue
into its store.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.matmul import (auto_inline_consumer_chain, auto_inline_producers, get_index_map,
                                         get_reduction_blocks)

FRAG = 16                     # the wmma fragment: 16x16x16
WARP = 32
VECTOR = 4                    # elements per thread per shared-memory copy
STAGING = "shared"            # the accumulator's staging: static shared memory (wmma_schedule)
STATIC_LIMIT = 48 * 1024      # what a block may declare statically
# The estimate's machine, in SM clock cycles (an H100-class SM; only the ratios between tiles matter):
STAGE_LATENCY = 300.0         # a pipeline stage's floor: global loads in flight and a block barrier
LOAD_BYTES_PER_CLOCK = 64.0   # L2 -> shared memory per SM
MMA_CLOCKS = 16.0             # one 16x16x16 wmma on one of the SM's 4 tensor units
TENSOR_UNITS = 4
MAX_WARPS_PER_SM = 16         # about 128 registers per thread: what the accumulators and pipeline need


@dataclass(frozen=True)
class WmmaTile:
    """A block of warps_m x warps_n warps, each computing frags_m x frags_n 16x16 output fragments,
    stepping K by k_frags fragments per pipeline stage."""

    warps_m: int
    warps_n: int
    frags_m: int
    frags_n: int
    k_frags: int

    @property
    def rows(self) -> int:
        return FRAG * self.warps_m * self.frags_m

    @property
    def cols(self) -> int:
        return FRAG * self.warps_n * self.frags_n

    @property
    def warps(self) -> int:
        return self.warps_m * self.warps_n

    def blocks(self, batch: int, m: int, n: int) -> int:
        return batch * math.ceil(m / self.rows) * math.ceil(n / self.cols)

    def dynamic_bytes(self) -> int:
        """A and B staged per pipeline stage, double-buffered, rows padded by 8 halves."""
        return 2 * (self.rows + self.cols) * (FRAG * self.k_frags + 8) * 2

    def static_bytes(self) -> int:
        """The accumulator staged per warp in fp32 (rows padded by 4)."""
        return self.warps * (FRAG * self.frags_m) * (FRAG * self.frags_n + 4) * 4

    def __str__(self) -> str:
        return f"{self.rows}x{self.cols} ({self.warps} warps x {self.frags_m}x{self.frags_n} frags, k {self.k_frags})"


def estimate(tile: WmmaTile, batch: int, m: int, n: int, k: int, sms: int) -> tuple[float, float]:
    """Clock cycles on the busiest SM, and how many of a stage's are work rather than the floor.
    The SM's blocks run in rounds of those resident at once; a round takes one time per K stage:
    the longest of the stage's floor latency, loading the resident blocks' A and B slices, and
    their mmas spread over the tensor units (padding counts as work). Where the floor decides (small
    matmuls), the tile with the least work per stage keeps the most margin for the model's error."""
    stages = math.ceil(k / (FRAG * tile.k_frags))
    per_sm = math.ceil(tile.blocks(batch, m, n) / sms)
    resident = min(per_sm, max(1, MAX_WARPS_PER_SM // tile.warps))
    load = resident * (tile.rows + tile.cols) * FRAG * tile.k_frags * 2 / LOAD_BYTES_PER_CLOCK
    mma = resident * tile.warps * tile.frags_m * tile.frags_n * tile.k_frags * MMA_CLOCKS / TENSOR_UNITS
    own = tile.frags_m * tile.frags_n * tile.k_frags * MMA_CLOCKS        # one warp's chain of mmas
    work = max(load, mma, own)
    return math.ceil(per_sm / resident) * stages * max(STAGE_LATENCY, work), work


def tiles(batch: int, m: int, n: int, k: int, sms: int, shared_limit: int) -> list[WmmaTile]:
    """Candidate tiles that fit the block's shared memory (`shared_limit`, the opt-in limit, holds
    dynamic and static together; static alone 48 KB) and are not more than twice the matrix,
    fastest estimate first (ties: the least work per stage, then the larger tile). K stages are
    64 wide, 32 for K < 64: a one-fragment stage does not lower in TVM 0.27."""
    k_frags = 4 if k >= 4 * FRAG else 2
    grid = [WmmaTile(wm, wn, fm, fn, k_frags) for wm in (1, 2, 4) for wn in (1, 2, 4) for fm in (1, 2, 4)
            for fn in (1, 2, 4) if fm * fn <= 4]
    fit = [t for t in grid if t.rows <= 2 * max(m, FRAG) and t.cols <= 2 * max(n, FRAG)
           and t.static_bytes() <= STATIC_LIMIT and t.dynamic_bytes() + t.static_bytes() <= shared_limit]
    return sorted(fit, key=lambda t: (*estimate(t, batch, m, n, k, sms), -t.rows * t.cols, -t.warps))


def matmul_extents(func: tirx.PrimFunc) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of the kernel's matmul once normalised to C[S, I, J] += A[S, I, K] * B[S, J, K],
    or None when it is not one with static extents."""
    sch = s_tir.Schedule(func)
    main = _main_block(sch)
    if main is None:
        return None
    _normalise(sch, main)
    extents = [iv.dom.extent for iv in sch.get(main).iter_vars]
    if len(extents) != 4 or not all(isinstance(e, tirx.IntImm) for e in extents):
        return None
    return tuple(int(e.value) for e in extents)


def wmma_schedule(func: tirx.PrimFunc, tile: WmmaTile, group: dict) -> s_tir.Schedule | None:
    """`func` on tensor cores with `tile` (fp16 operands, fp32 accumulator: what optimize/precision.py
    writes), or None where a step does not apply. `group` is TVM's wmma intrinsic group for fp16
    operands in shared.dyn and an fp32 accumulator staged in STAGING."""
    sch = s_tir.Schedule(func)
    main = _main_block(sch)
    if main is None:
        return None
    _drop_unread(sch, func, main)
    _normalise(sch, main)
    sch.pad_einsum(main, [1, tile.rows, tile.cols, FRAG * tile.k_frags])
    outer, k0, k1, warp = _tile_loops(sch, main, tile)
    a_shared = _stage_in_shared(sch, outer, 0, k0, tile.warps)
    b_shared = _stage_in_shared(sch, outer, 1, k0, tile.warps)
    auto_inline_producers(sch, a_shared)
    auto_inline_producers(sch, b_shared)
    a_frag = sch.cache_read(outer, 0, "wmma.matrix_a")
    b_frag = sch.cache_read(outer, 1, "wmma.matrix_b")
    sch.compute_at(a_frag, k1)
    sch.compute_at(b_frag, k1)
    staged = sch.cache_write(outer, 0, STAGING)
    sch.storage_align(staged, 0, -2, FRAG, 4)
    store = sch.cache_write(outer, 0, "wmma.accumulator")
    sch.reverse_compute_at(store, warp)
    sch.reverse_compute_at(staged, warp)
    _split_fragments(sch, store, unroll=False)
    init = sch.get_child_blocks(sch.decompose_reduction(outer, k0))[0]
    try:
        for block, name in ((a_frag, "load_a"), (b_frag, "load_b")):
            sch.tensorize(_split_fragments(sch, block, unroll=True), group[name])
        sch.tensorize(sch.get_loops(init)[-2], group["init"])
        sch.tensorize(sch.get_loops(store)[-2], group["store"])
        sch.tensorize(sch.get_loops(main)[-3], group["compute"])
    except Exception:  # noqa: BLE001 - a tensorize that does not match raises TVM errors of many kinds
        return None
    auto_inline_consumer_chain(sch, staged)
    fused = sch.fuse(*sch.get_loops(staged)[-2:])
    _, lane, vec = sch.split(fused, [None, WARP, VECTOR])
    sch.bind(lane, "threadIdx.x")
    sch.vectorize(vec)
    return sch


def _main_block(sch: s_tir.Schedule):
    reductions = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
    if not reductions or get_index_map(sch.get(reductions[0])) is None:
        return None
    return reductions[0]


def _drop_unread(sch: s_tir.Schedule, func: tirx.PrimFunc, main) -> None:
    """Blocks whose intermediate nobody reads (the other outputs of a split folded into this kernel
    by global fusion) go: no thread binding would cover them."""
    params = {p.name for p in func.params}
    for block in sch.get_child_blocks(get_root_block(sch)):
        stmt = sch.get(block)
        if stmt.same_as(sch.get(main)) or sch.get_consumers(block):
            continue
        if all(w.source.name not in params for w in stmt.writes):
            sch.compute_inline(block)


def _normalise(sch: s_tir.Schedule, main) -> None:
    """Reindex the matmul to C[S, I, J] += A[S, I, K] * B[S, J, K] (dlight's index maps)."""
    a, b, c = (sch.reindex(main, ("read", 0)), sch.reindex(main, ("read", 1)), sch.reindex(main, ("write", 0)))
    block_map, a_map, b_map, c_map = get_index_map(sch.get(main))
    sch.transform_layout(a, ("write", 0), a_map)
    sch.transform_layout(b, ("write", 0), b_map)
    sch.transform_layout(c, ("read", 0), c_map)
    sch.transform_block_layout(main, block_map)


def _tile_loops(sch: s_tir.Schedule, main, tile: WmmaTile):
    """Fragments blockized; blocks x warps x per-warp fragments, K in stages of k_frags. Returns the
    blockized mma, the stage loop, the fragment loop inside it and the warp loop."""
    batch, i, j, k = sch.get_loops(main)
    i, i_frag = sch.split(i, [None, FRAG])
    j, j_frag = sch.split(j, [None, FRAG])
    k, k_frag = sch.split(k, [None, FRAG])
    sch.reorder(i, j, k, i_frag, j_frag, k_frag)
    outer = sch.blockize(i_frag)
    i_block, i_warp, i_own = sch.split(i, [None, tile.warps_m, tile.frags_m])
    j_block, j_warp, j_own = sch.split(j, [None, tile.warps_n, tile.frags_n])
    k0, k1 = sch.split(k, [None, tile.k_frags])
    # the stage and order TVM's wmma pipeline takes for this loop nest (as dlight's rule annotates it)
    sch.annotate(k0, "software_pipeline_order", [0, 3, 1, 4, 5, 2, 6])
    sch.annotate(k0, "software_pipeline_stage", [0, 0, 0, 0, 0, 1, 1])
    sch.annotate(k1, "software_pipeline_order", [0, 1, 2])
    sch.annotate(k1, "software_pipeline_stage", [0, 0, 1])
    sch.reorder(i_block, j_block, i_warp, j_warp, k0, k1, i_own, j_own)
    block = sch.fuse(i_block, j_block)
    warp = sch.fuse(i_warp, j_warp)
    sch.bind(batch, "blockIdx.z")
    sch.bind(block, "blockIdx.x")
    sch.bind(warp, "threadIdx.y")
    return outer, k0, k1, warp


def _stage_in_shared(sch: s_tir.Schedule, outer, index: int, k0, warps: int):
    """Operand `index` copied to dynamic shared memory once per stage by all the block's threads."""
    copy = sch.cache_read(outer, index, "shared.dyn")
    sch.compute_at(copy, k0)
    fused = sch.fuse(*sch.get_loops(copy)[-2:])
    _, warp, lane, vec = sch.split(fused, [None, warps, WARP, VECTOR])
    sch.bind(warp, "threadIdx.y")
    sch.bind(lane, "threadIdx.x")
    sch.vectorize(vec)
    sch.storage_align(copy, 0, axis=-2, factor=16, offset=8)      # rows offset by 8 halves: no bank conflicts
    sch.annotate(copy, "tirx.manifest_shared_memory_local_stage", 1)
    sch.annotate(copy, "double_buffer_scope", 0)
    return copy


def _split_fragments(sch: s_tir.Schedule, block, unroll: bool):
    """The block's last two loops as (fragment, 16x16 inside it); returns the inner 16-row loop."""
    i, j = sch.get_loops(block)[-2:]
    i0, i1 = sch.split(i, [None, FRAG])
    j0, j1 = sch.split(j, [None, FRAG])
    sch.reorder(i0, j0, i1, j1)
    if unroll:
        sch.unroll(i0)
        sch.unroll(j0)
    return i1
