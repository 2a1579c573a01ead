"""The GPU state space and cost model: levels "block" (tile staged in shared memory, one CUDA
block) and "thread" (register tile of one thread), plus virtual threads (L = 2, as the paper
has for NVIDIA GPUs).

Capacity checks: shared memory per block (48 KB static), threads per block, registers per
thread. The estimate for the final ranking: compute time at the achieved occupancy and ILP,
DRAM and shared-memory transfer time (bank conflicts relieved by vThreads, Eq. 3), and wave
quantization of the blocks over the SMs.
"""
from __future__ import annotations

import math

from .cpu_model import divisors, prod
from ..hardware import Hardware
from .plan import GPU_LEVELS, REDUCE, TilePlan
from .walk import Space, State, caching_benefit, tiling_benefit, vthread_benefit
from .workload import Workload

BLOCK, THREAD = 0, 1
MAX_VTHREAD = 8
MAX_ACCUMULATORS = 64           # registers per thread for the output tile (of 255)
SMEM_PER_SM = 96 * 1024         # shared memory per SM shared by resident blocks (conservative)


class GpuSpace(Space):
    levels = GPU_LEVELS

    def __init__(self, wl: Workload, hw: Hardware):
        self.wl, self.hw, self.extents = wl, hw, wl.extents
        self.spatial_points = prod(e for e, k in zip(wl.extents, wl.kinds) if k != REDUCE)

    def candidates(self, d: int, k: int, parent: int) -> tuple[int, ...]:
        if self.wl.extents[d] == 1 or (self.wl.kinds[d] == REDUCE and k == THREAD):
            return (1,)
        return divisors(parent)

    def initial(self) -> State:
        n = len(self.wl.extents)
        return State(tuple((1, 1) for _ in range(n)), BLOCK, (1,) * n)

    def actions(self, s: State) -> list[tuple[str, int, State]]:
        out = []
        k = s.level
        for d in range(len(self.extents)):
            out += [(name, d, self._fix_vthread(s2, d)) for name, _, s2 in self.tile_moves(s, d)]
            if k == THREAD and self.wl.kinds[d] != REDUCE:
                vs = [v for v in divisors(s.tiles[d][THREAD]) if 1 < v <= MAX_VTHREAD and v > s.vthreads[d]]
                if vs:
                    out.append(("vthread", d, s.with_vthread(d, vs[0])))
        if k == BLOCK:
            out.append(("cache", -1, State(s.tiles, THREAD, s.vthreads)))
        return out

    @staticmethod
    def _fix_vthread(s: State, d: int) -> State:
        """Keep the vThread count a divisor of the (possibly smaller) thread tile."""
        v = s.vthreads[d]
        return s if s.tiles[d][THREAD] % v == 0 else s.with_vthread(d, math.gcd(v, s.tiles[d][THREAD]))

    def complete(self, s: State) -> State:
        return State(s.tiles, THREAD, s.vthreads)

    # -- footprints and traffic -------------------------------------------------------------
    def _tile(self, s: State, k: int, full_reduce: bool = False) -> list[int]:
        out = []
        for d, row in enumerate(s.tiles):
            if self.wl.kinds[d] == REDUCE:
                out.append(self.wl.extents[d] if full_reduce else row[BLOCK] if k == BLOCK else 1)
            else:
                out.append(row[k])
        return out

    def threads(self, s: State) -> int:
        return prod(r[BLOCK] // r[THREAD] for r, k in zip(s.tiles, self.wl.kinds) if k != REDUCE)

    def blocks(self, s: State) -> int:
        return prod(e // r[BLOCK] for e, r, k in zip(self.wl.extents, s.tiles, self.wl.kinds) if k != REDUCE)

    def chunks(self, s: State) -> int:
        return prod(e // r[BLOCK] for e, r, k in zip(self.wl.extents, s.tiles, self.wl.kinds) if k == REDUCE)

    def smem_bytes(self, s: State) -> int:
        return self._cached(("smem", s.tiles), lambda: self._smem_bytes(s))

    def _smem_bytes(self, s: State) -> int:
        t = self._tile(s, BLOCK)
        return sum(a.footprint(t) * a.elem_bytes for a in self.wl.inputs)

    def registers(self, s: State) -> tuple[int, int]:
        """(accumulators, operand registers) of one thread."""
        return self._cached(("regs", s.tiles), lambda: self._registers(s))

    def _registers(self, s: State) -> tuple[int, int]:
        t = self._tile(s, THREAD)
        return self.wl.output.footprint(t), sum(a.footprint(t) for a in self.wl.inputs)

    def footprint(self, s: State, k: int) -> int:
        if k == BLOCK:
            return self.smem_bytes(s)
        acc, ops = self.registers(s)
        return (acc + ops) * 4

    def traffic(self, s: State, k: int) -> float:
        return self._cached(("traffic", s.tiles, k), lambda: self._traffic(s, k))

    def _traffic(self, s: State, k: int) -> float:
        if k == BLOCK:
            t = self._tile(s, BLOCK, full_reduce=True)
            return self.blocks(s) * sum(a.footprint(t) * a.elem_bytes for a in self.wl.inputs) \
                + self.wl.output.footprint(self.wl.extents) * self.wl.output.elem_bytes
        t = self._tile(s, THREAD)
        for d, kind in enumerate(self.wl.kinds):
            if kind == REDUCE:
                t[d] = s.tiles[d][BLOCK]
        return self.blocks(s) * self.chunks(s) * self.threads(s) * sum(a.footprint(t) * a.elem_bytes
                                                                      for a in self.wl.inputs)

    # -- the walk's scores ------------------------------------------------------------------
    def valid(self, s: State) -> bool:
        """Capacity limits, and at the thread level at least a warp of threads per block (when
        the kernel has that many outputs): a block narrower than a warp wastes its lanes, and
        since caching is one-way the walk must grow the block tile before it moves on."""
        acc, ops = self.registers(s)
        if s.level == THREAD and self.threads(s) < min(self.hw.warp, self.spatial_points):
            return False
        return (self.smem_bytes(s) <= self.hw.smem_per_block and self.threads(s) <= self.hw.max_threads
                and acc <= MAX_ACCUMULATORS and acc + ops <= self.hw.registers_per_thread - 32
                and sum(v > 1 for v in s.vthreads) <= 3)

    def _bank_relief(self, s: State) -> float:
        return prod(vthread_benefit(s.tiles[d][BLOCK], v, self.hw.bank_width) for d, v in enumerate(s.vthreads))

    def benefit(self, s: State, action: str, d: int, s2: State) -> float:
        k = s.level
        if action == "cache":
            # S_data = all bytes the level exchanges (Q), not one tile: with a tile's few bytes
            # Eq. 2 is the latency ratio (shared 25 : register 1), which made caching win the
            # first step of every walk before any block tile had grown.
            low, high = self.hw.levels[k + 1], self.hw.levels[k + 2]
            return caching_benefit(low.latency, low.bandwidth * self.hw.cores, high.latency,
                                   high.bandwidth * self.hw.cores, self.traffic(s, k))
        if action == "vthread":
            return self._bank_relief(s2) / self._bank_relief(s)
        return tiling_benefit(self.traffic(s, k), self.footprint(s, k), self.traffic(s2, k), self.footprint(s2, k))

    def estimate(self, s: State) -> float:
        return self._cached(("estimate", s.tiles, s.vthreads), lambda: self._estimate(s))

    def _estimate(self, s: State) -> float:
        hw = self.hw
        threads, blocks = self.threads(s), self.blocks(s)
        acc, ops = self.registers(s)
        regs = min(255, acc + ops + 24)
        smem = max(self.smem_bytes(s), 1)
        per_sm = max(1, min(32, 2048 // threads, SMEM_PER_SM // smem, 65536 // (threads * regs)))
        waves = math.ceil(blocks / (hw.cores * per_sm))
        quantization = waves * hw.cores * per_sm / blocks
        warps = min(blocks, hw.cores * per_sm) * math.ceil(threads / hw.warp) / hw.cores
        eff = min(1.0, warps / 16) * min(1.0, acc / 4) * min(1.0, threads / hw.warp)
        flops = self.wl.points * self.wl.flops_per_point
        compute = flops / (hw.cores * hw.flops_per_cycle * max(eff, 1e-3)) * quantization
        dram = self.traffic(s, BLOCK) / (hw.level("DRAM").bandwidth * hw.cores)
        smem_t = self.traffic(s, THREAD) / (hw.level("shared").bandwidth * hw.cores) / self._bank_relief(s)
        cycles = max(compute, dram, smem_t) + waves * self.chunks(s) * 40
        return cycles / (hw.ghz * 1e9)

    def to_plan(self, s: State) -> TilePlan:
        wl = self.wl
        return TilePlan(wl.axes, wl.kinds, wl.extents, s.tiles, GPU_LEVELS, s.vthreads)
