"""Register-blocked plans for window kernels: few products per output (depthwise convs, pooling,
1x1 convs from a few channels: at most MEMORY_BOUND_REDUCTION).

Gensor's walk fixes the parallel and L1 tiles before the register tile, and for a kernel that
reduces over a small window only (a 3x3 depthwise conv: 9 products per output) the moves that
would make room for a register tile along the output row barely change the traffic the walk
scores; it settles on one accumulator vector per step, a chain of dependent FMAs (MobileNet-like
and PP-OCR depthwise convs ran 1.5-2.2x onnxruntime's node time). These plans are built the way
onnxruntime's and OpenVINO's depthwise kernels are: the channel block in vector lanes, a few
output positions along the row (and rows) as independent accumulators, enough of them to cover
the FMA latency, the whole window reduced while they stay in registers (one reduction chunk:
cpu_lower.py writes each register tile back through the epilogue), each task a band of rows of
one channel block, reading its padding inline (bounds tested per read, where the lanes share the
test: NCHW{c}) or else computing it per task. They are candidates beside the walk's, timed like
them; the fastest wins.
"""
from __future__ import annotations

from ..hardware import MEMORY_BOUND_REDUCTION
from .cpu_model import CpuSpace, divisors
from .plan import CPU_LEVELS, REDUCE, TilePlan
from .workload import Workload

TASKS_PER_CORE = 4           # parallel tasks per core at least (row bands balance across cores)
MAX_BAND_ROWS = 8            # rows of one task at most (per-task padding recomputes k - 1 halo rows)
MAX_TILES = 2                # register tiles offered per kernel


def _row_axes(wl: Workload) -> list[int]:
    """The output's spatial iterators other than the vector lanes, innermost buffer dim first."""
    out = []
    for row in reversed(wl.output.coef):
        d = next((i for i, c in enumerate(row) if c), -1)
        if d >= 0 and d != wl.vector_axis and wl.kinds[d] != REDUCE and wl.extents[d] > 1 and d not in out:
            out.append(d)
    return out


def register_tiles(x: int, y: int, most: int, enough: int) -> list[tuple[int, int]]:
    """(rows, columns) register tiles of at most `most` accumulators, dividing the extents `y`
    and `x`, one per row count, nearest to `enough` accumulators first: one or two rows where
    such a tile reaches half of `enough`, else any (rows alone when no divisor of `x` fits)."""
    cands = [(r, c) for r in divisors(y) for c in divisors(x) if 2 <= r * c <= most]
    good = [(r, c) for r, c in cands if r <= 2 and r * c >= enough // 2]
    pool = good or cands
    pool.sort(key=lambda rc: (abs(rc[0] * rc[1] - enough), rc[0]))
    out: list[tuple[int, int]] = []
    for rc in pool:
        if rc[0] not in {o[0] for o in out}:
            out.append(rc)
    return out[:MAX_TILES]


def window_plans(space: CpuSpace) -> list[TilePlan]:
    """Register-blocked plans for a window kernel (see the module doc); none for other kernels."""
    wl, hw, vec = space.wl, space.hw, space.wl.vector_axis
    products = 1
    for d in wl.reduce():
        products *= wl.extents[d]
    rows = _row_axes(wl)
    if vec < 0 or not rows or products > MEMORY_BOUND_REDUCTION:
        return []
    x, y = rows[0], rows[1] if len(rows) > 1 else -1
    ext_y = wl.extents[y] if y >= 0 else 1
    others = 1                                            # spatial extents outside the row bands
    for d in wl.spatial():
        if d not in (x, y, vec):
            others *= wl.extents[d]
    pipes = max(hw.flops_per_cycle / (2 * hw.lanes), 1)
    enough = int(pipes * hw.fma_latency)                  # independent accumulators that hide the latency
    most = min(12, (hw.vector_registers - 1) // 2)        # accumulators + as many operand loads + a weight
    plans = []
    for r, c in register_tiles(wl.extents[x], ext_y, most, enough):
        bands = [b for b in divisors(ext_y) if b % r == 0 and b <= max(MAX_BAND_ROWS, r)]
        fits = [b for b in bands if others * (ext_y // b) >= TASKS_PER_CORE * hw.cores]
        band = max(fits) if fits else min(bands)
        tiles = []
        for d, (e, kind) in enumerate(zip(wl.extents, wl.kinds)):
            if kind == REDUCE:
                tiles.append((e, e, 1))
            elif d == vec:
                tiles.append((e, e, space.v0))
            elif d == x:
                tiles.append((e, e, c))
            elif d == y:
                tiles.append((band, r, r))
            else:
                tiles.append((1, 1, 1))
        plans.append(TilePlan(wl.axes, wl.kinds, wl.extents, tuple(tiles), CPU_LEVELS, (), vec,
                              pad=wl.preferred_pad))
    return plans
