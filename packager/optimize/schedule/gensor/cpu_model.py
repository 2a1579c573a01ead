"""The CPU state space and cost model: levels L2 (one parallel task), L1 and registers.

Q (traffic into a level) and F (footprint in it) follow Roller's tile model over the affine
footprints of workload.py; the reduction is chunked at L1 (its operands for one chunk stay in
L1 while the register tiles sweep the task's tile). The estimate for the final ranking is a
small roofline: micro-kernel cycles (FMA throughput, load ports, FMA latency chains), DRAM and
L2 transfer time, parallel waves over the cores, and a per-task overhead.
"""
from __future__ import annotations

import math
from functools import lru_cache

from ..hardware import Hardware
from .plan import CPU_LEVELS, REDUCE, TilePlan
from .walk import Space, State, caching_benefit, tiling_benefit
from .workload import Workload

L2, L1, REG = 0, 1, 2
CAPACITY_SHARE = 0.75       # of a cache the tile may fill (the rest: stack, epilogue operands)
MAX_REG_ROWS = 32           # register-tile extent of a non-vector iterator (registers bound it first)
TASK_OVERHEAD_CYCLES = 400  # dispatching one parallel task and its accumulator init/writeback


@lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


class CpuSpace(Space):
    levels = CPU_LEVELS

    def __init__(self, wl: Workload, hw: Hardware):
        self.wl, self.hw, self.extents = wl, hw, wl.extents
        self.elem = wl.output.elem_bytes
        self.lanes = max(hw.lanes * 4 // self.elem, 1)
        self.vec = wl.vector_axis if wl.vector_axis >= 0 and wl.extents[wl.vector_axis] > 1 else -1
        self.v0 = 1
        if self.vec >= 0:
            ext = wl.extents[self.vec]
            small = [d for d in divisors(ext) if d <= self.lanes]
            self.v0 = self.lanes if ext % self.lanes == 0 else (max(small) if max(small) >= 2 else 1)

    # -- the graph ------------------------------------------------------------------------
    def candidates(self, d: int, k: int, parent: int) -> tuple[int, ...]:
        ext = self.wl.extents[d]
        if ext == 1:
            return (1,)
        if self.wl.kinds[d] == REDUCE:
            return (ext,) if k == L2 else (1,) if k == REG else divisors(parent)
        divs = divisors(parent)
        if d == self.vec:
            divs = tuple(x for x in divs if x % self.v0 == 0)
            if k == REG:
                divs = tuple(x for x in divs if x <= 4 * self.lanes) or (self.v0,)
        elif k == REG:
            divs = tuple(x for x in divs if x <= MAX_REG_ROWS)
        return divs

    def initial(self) -> State:
        tiles = []
        for d, ext in enumerate(self.wl.extents):
            row, parent = [], ext
            for k in range(3):
                parent = self.candidates(d, k, parent)[0]
                row.append(parent)
            tiles.append(tuple(row))
        return State(tuple(tiles), 0)

    def actions(self, s: State) -> list[tuple[str, int, State]]:
        out = [m for d in range(len(self.extents)) for m in self.tile_moves(s, d)]
        if s.level < REG:
            out.append(("cache", -1, State(s.tiles, s.level + 1, s.vthreads)))
        return out

    def complete(self, s: State) -> State:
        return State(s.tiles, REG, s.vthreads)

    # -- footprints and traffic -------------------------------------------------------------
    def _tile(self, s: State, k: int, chunk_level: int = L1) -> list[int]:
        """Tile at level k, reductions at their L1 chunk (or full at k = L2 when chunk_level < 0)."""
        out = []
        for d, row in enumerate(s.tiles):
            if self.wl.kinds[d] == REDUCE:
                out.append(self.wl.extents[d] if chunk_level < 0 else row[chunk_level] if k < REG else 1)
            else:
                out.append(row[k])
        return out

    def _in_bytes(self, tile: list[int]) -> int:
        t = tuple(tile)
        return self._cached(("in", t), lambda: sum(a.footprint(t) * a.elem_bytes for a in self.wl.inputs))

    def _acc_bytes(self, tile: list[int]) -> int:
        return self.wl.output.footprint(tile) * 4

    def register_use(self, s: State) -> tuple[int, int, int]:
        """(accumulator vectors, vector operand loads, broadcast loads) of one micro-kernel step."""
        return self._cached(("reg", s.tiles), lambda: self._register_use(s))

    def _register_use(self, s: State) -> tuple[int, int, int]:
        t0 = self._tile(s, REG)
        acc = self.wl.output.footprint(t0)
        acc_vecs = math.ceil(acc / self.lanes) if self.vec >= 0 else acc
        vec_loads = bcast = 0
        for a in self.wl.inputs:
            n = a.footprint(t0)
            if self.vec >= 0 and a.uses(self.vec):
                vec_loads += math.ceil(n / self.lanes)
            else:
                bcast += n
        return acc_vecs, vec_loads, bcast

    def one_chunk(self, s: State) -> bool:
        """The whole reduction is one L1 chunk: the lowering then keeps each register tile's
        accumulators in registers until its reduction is done (cpu_lower.py), none in L1 or L2."""
        return all(r[L1] == e for e, r, k in zip(self.wl.extents, s.tiles, self.wl.kinds) if k == REDUCE)

    def footprint(self, s: State, k: int) -> int:
        if k == REG:
            acc, vl, bc = self.register_use(s)
            return (acc + vl + min(bc, 2)) * self.lanes * 4
        t = self._tile(s, k)
        if self.one_chunk(s):
            return self._in_bytes(t)
        return self._in_bytes(t) + self._cached(("acc", tuple(t)), lambda: self._acc_bytes(t))

    def counts(self, s: State) -> tuple[int, int, int, int]:
        """(parallel tasks, reduction chunks, L1 tiles per task, register tiles per L1 tile)."""
        wl = self.wl
        tasks = prod(e // r[L2] for e, r, k in zip(wl.extents, s.tiles, wl.kinds) if k != REDUCE)
        chunks = prod(e // r[L1] for e, r, k in zip(wl.extents, s.tiles, wl.kinds) if k == REDUCE)
        l1 = prod(r[L2] // r[L1] for r, k in zip(s.tiles, wl.kinds) if k != REDUCE)
        regs = prod(r[L1] // r[REG] for r, k in zip(s.tiles, wl.kinds) if k != REDUCE)
        return tasks, chunks, l1, regs

    def traffic(self, s: State, k: int) -> float:
        """Bytes moved into level k's memory from the level below for the whole kernel."""
        return self._cached(("traffic", s.tiles, k), lambda: self._traffic(s, k))

    def _traffic(self, s: State, k: int) -> float:
        tasks, chunks, l1, regs = self.counts(s)
        if k == L2:
            return tasks * self._in_bytes(self._tile(s, L2, -1)) + self.wl.output.footprint(self.wl.extents) * self.elem
        if k == L1:
            acc = self._acc_bytes(self._tile(s, L2))
            big = acc > CAPACITY_SHARE * self.hw.level("L1").capacity and not self.one_chunk(s)
            spill = 2 * acc * chunks * tasks if big else 0
            return tasks * chunks * l1 * self._in_bytes(self._tile(s, L1)) + spill
        acc_vecs, vl, bc = self.register_use(s)
        steps = self.wl.points // prod(self._tile(s, REG))
        return (steps * (vl * self.lanes + bc) + 2 * tasks * chunks * l1 * regs * acc_vecs * self.lanes) * self.elem

    # -- the walk's scores ------------------------------------------------------------------
    def valid(self, s: State) -> bool:
        return self._cached(("valid", s.tiles), lambda: self._valid(s))

    def _valid(self, s: State) -> bool:
        acc, vl, bc = self.register_use(s)
        if acc + vl + min(bc, 2) > self.hw.vector_registers:
            return False
        return (self.footprint(s, L1) <= CAPACITY_SHARE * self.hw.level("L1").capacity
                and self.footprint(s, L2) <= CAPACITY_SHARE * self.hw.level("L2").capacity)

    def benefit(self, s: State, action: str, d: int, s2: State) -> float:
        k = s.level
        if action == "cache":
            low, high = self.hw.levels[k + 1], self.hw.levels[k + 2]
            return caching_benefit(low.latency, low.bandwidth, high.latency, high.bandwidth, self.footprint(s, k))
        return tiling_benefit(self.traffic(s, k), self.footprint(s, k), self.traffic(s2, k), self.footprint(s2, k))

    def estimate(self, s: State) -> float:
        """Seconds: max(compute, DRAM, L2) over the waves of parallel tasks, plus task overhead."""
        return self._cached(("estimate", s.tiles), lambda: self._estimate(s))

    def _estimate(self, s: State) -> float:
        hw = self.hw
        tasks, chunks, l1, regs = self.counts(s)
        acc, vl, bc = self.register_use(s)
        steps = self.wl.points // prod(self._tile(s, REG))
        pipes = max(hw.flops_per_cycle / (2 * hw.lanes), 1)             # FMA pipes per core
        step_cycles = max(acc / pipes, (vl + bc) / 2, hw.fma_latency)
        compute = steps * step_cycles + 2 * tasks * chunks * l1 * regs * acc
        active = min(tasks, hw.cores)
        waves = math.ceil(tasks / hw.cores)
        per_core = compute / tasks * waves if tasks else compute
        dram = self.traffic(s, L2) / (hw.level("DRAM").bandwidth * active)
        l2 = self.traffic(s, L1) / (hw.level("L2").bandwidth * active)
        cycles = max(per_core, dram, l2) + waves * TASK_OVERHEAD_CYCLES
        return cycles / (hw.ghz * 1e9)

    def to_plan(self, s: State) -> TilePlan:
        wl = self.wl
        return TilePlan(wl.axes, wl.kinds, wl.extents, s.tiles, CPU_LEVELS, (), self.vec)
