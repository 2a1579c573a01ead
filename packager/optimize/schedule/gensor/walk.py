"""Gensor's construction walk (Algorithms 1 and 2) over a state space, and its formulas.

A state is a tile matrix (iterator x memory level), the level being scheduled, and virtual
threads. Actions: tile / invTile (next larger / smaller candidate of one iterator at the
current level), cache (move to the next, faster level), setVThread (GPU). Each action's
probability is its analytical benefit (Eq. 1 tiling, Eq. 2 caching x the annealing bias m(t),
Eq. 3 vThread), 0 when the new state breaks a capacity limit, normalized over all actions
(Eq. 4). The temperature halves every step; a visited state is kept with probability
1 - sigmoid(0.5 (t - 10)) (t = -log2 T). The paper leaves Q and F undefined, the log base,
T0/threshold and the final choice open; our choices: Q and F from the affine footprint model
(workload.py), log2, T0 = 1 and 100 halvings, and the result is every kept state plus the final
and the best-estimated state of each seeded restart, ranked by the space's time estimate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class State:
    tiles: tuple[tuple[int, ...], ...]     # tiles[d][k], outer level first
    level: int                             # level being scheduled
    vthreads: tuple[int, ...] = ()

    def with_tile(self, d: int, value: int) -> "State":
        row = list(self.tiles[d])
        row[self.level] = value
        return replace(self, tiles=self.tiles[:d] + (tuple(row),) + self.tiles[d + 1:])

    def with_vthread(self, d: int, value: int) -> "State":
        return replace(self, vthreads=self.vthreads[:d] + (value,) + self.vthreads[d + 1:])


def tiling_benefit(q: float, f: float, q2: float, f2: float) -> float:
    """Eq. 1: traffic decrease over footprint increase, Q(T) F(T') / (Q(T') F(T))."""
    return (q * f2) / (q2 * f) if q2 > 0 and f > 0 else 0.0


def caching_benefit(lat_low: float, bw_low: float, lat_high: float, bw_high: float, nbytes: float) -> float:
    """Eq. 2: time to move the tile from the slower level over the time from the faster one."""
    return (lat_low + nbytes / bw_low) / (lat_high + nbytes / bw_high)


def vthread_benefit(x_words: int, v: int, bank_width: int = 32) -> float:
    """Eq. 3: bank conflicts without over with v virtual threads, ceil(x/W) / ceil(x/(V W))."""
    return math.ceil(x_words / bank_width) / math.ceil(x_words / (v * bank_width))


def cache_bias(t: float) -> float:
    """m(t) = 3 / (1 + exp(-(ln 5 / 10)(t - 10))): 0.5 at t = 0, 1.5 at 10, toward 3."""
    return 3.0 / (1.0 + math.exp(-(math.log(5) / 10) * (t - 10)))


def keep_probability(t: float) -> float:
    """1 - sigmoid(0.5 (t - 10)), t = -log2(T)."""
    return 1.0 - 1.0 / (1.0 + math.exp(-0.5 * (t - 10)))


class Space:
    """What a target's state space provides to the walk (cpu_model / gpu_model implement it)."""

    extents: tuple[int, ...] = ()

    def candidates(self, d: int, k: int, parent: int) -> tuple[int, ...]: ...

    def _cached(self, key: tuple, compute):
        """A pure function of a state, memoized per kernel's space: the walk revisits states."""
        memo = self.__dict__.setdefault("_memo", {})
        value = memo.get(key)
        if value is None:
            value = memo[key] = compute()
        return value

    def tile_moves(self, s: State, d: int) -> list[tuple[str, int, State]]:
        """tile / invTile of iterator d at the current level: the next larger / smaller candidate
        among the divisors of the tile one level up (the extent at the outermost level)."""
        k = s.level
        parent = self.extents[d] if k == 0 else s.tiles[d][k - 1]
        cands = self.candidates(d, k, parent)
        cur = s.tiles[d][k]
        i = cands.index(cur) if cur in cands else 0
        out = []
        if i + 1 < len(cands):
            out.append(("tile", d, s.with_tile(d, cands[i + 1])))
        if i > 0:
            out.append(("invtile", d, s.with_tile(d, cands[i - 1])))
        return out

    def initial(self) -> State: ...
    def actions(self, s: State) -> list[tuple[str, int, State]]: ...
    def benefit(self, s: State, action: str, d: int, s2: State) -> float: ...
    def valid(self, s: State) -> bool: ...
    def estimate(self, s: State) -> float: ...          # seconds, for the final ranking
    def complete(self, s: State) -> State: ...          # a state fit for lowering


def roulette(rng: np.random.Generator, weights: list[float]) -> int:
    """Cumulative-sum roulette selection (the paper's loop is not one; this is what it means)."""
    total = sum(weights)
    x = rng.random() * total
    acc = 0.0
    for i, w in enumerate(weights):
        acc += w
        if x < acc:
            return i
    return max(range(len(weights)), key=lambda i: weights[i])


def walk(space: Space, seed: int, steps: int = 100) -> tuple[list[State], State]:
    """One annealed walk (Algorithm 1): kept states and the best state seen by estimate."""
    rng = np.random.default_rng(seed)
    s = space.initial()
    kept: list[State] = []
    best, best_t = space.complete(s), space.estimate(space.complete(s))
    temperature, threshold = 1.0, 2.0 ** -steps
    while temperature > threshold:
        t = -math.log2(temperature)
        moves = space.actions(s)
        weights = []
        for name, d, s2 in moves:
            if not space.valid(s2):
                weights.append(0.0)
                continue
            w = space.benefit(s, name, d, s2)
            weights.append(w * cache_bias(t) if name == "cache" else w)
        if not moves or sum(weights) <= 0:
            break
        s = moves[roulette(rng, weights)][2]
        done = space.complete(s)
        est = space.estimate(done)
        if est < best_t:
            best, best_t = done, est
        if rng.random() < keep_probability(t):
            kept.append(done)
        temperature /= 2
    kept.append(space.complete(s))
    return kept, best


def construct(space: Space, seed: int, restarts: int = 6, steps: int = 100) -> list[tuple[float, State]]:
    """Seeded restarts of the walk; all distinct candidates with their estimates, best first."""
    seen: dict[State, float] = {}
    for r in range(restarts):
        kept, best = walk(space, seed * 7919 + r, steps)
        for st in kept + [best]:
            if st not in seen and space.valid(st):
                seen[st] = space.estimate(st)
    return sorted(((e, st) for st, e in seen.items()), key=lambda x: (x[0], x[1].tiles, x[1].vthreads))
