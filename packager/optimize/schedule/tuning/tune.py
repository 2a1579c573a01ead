"""Measured tuning (`optimize.level: 3`, or a budget in `optimize.tuning.trials` / `seconds`):
a search over Gensor's CPU space per kernel, every candidate timed where the target runs.

It starts where level 2 ends (Gensor's measured choice per kernel, ETO reuse included) and
spends a per-model budget in rounds. A round of one kernel:

1. parents: the kernel's fastest measured programs (the level-2 choice first);
2. children: each parent mutated once or twice: one iterator's tile at one level moved to a
   neighbouring divisor (the levels under it repaired), the reduction chunk loop moved
   inside / outside the L1 tiles (TilePlan.order), or a memory-bound kernel's padding computed
   per task instead of staged or back (TilePlan.pad); invalid (over a cache or the registers)
   and already-measured children are dropped;
3. the batch: the children the cost model ranks best plus a few random ones (the model is
   wrong often enough that a search led only by it stalls);
4. the batch is compiled in one module and timed in one run next to the kernel's current best:
   a child replaces it only when 2% faster than the best's fastest time so far, this run's
   included (noise only slows a run, so the fastest time seen is the best estimate of a
   program's speed, and a noisy run of the incumbent cannot let a slower program in).

The budget goes round by round to the kernel with the most time to gain, Ansor's task
scheduler simplified: weight = current best time x 0.5^(rounds without a gain); a kernel whose
space is exhausted leaves the queue. Kernels still under their own allotment (a share, or the
reuse cap) go first: a heavy kernel that keeps gaining 2% a round would otherwise spend the
budget of the kernels waiting on it as their reuse parent.

With ETO's reuse on, the tuner builds its own reuse graph over the kernels it searches (sketch
and Definition 2 as in reuse.py; a root costs a full share, a reuse edge the reuse cap) and,
with ETO's bridge operators (bridge.py, `optimize.passes.bridges`), the greedy Steiner tree
over the kernels and their 1-hop bridges: a bridge kernel is tuned (never deployed) where it
joins kernels whose extents cross. A non-root kernel waits until its parent's search has
settled, then starts from the parent's tuned program adapted to its extents (timed first) and
gets `reuse_cap` programs, an eighth of a kernel's share (ETO: re-search the tile factors
around the source's program instead of a full search). A root that the database holds a tuned
program of its sketch for (another model's: cross-model reuse) does the same from that program.

Every kernel the tuner considered is recorded with its `tuned` trials beside level 2's record, so
a rebuild with the same database replays the same programs (deterministic given the database)
and only kernels never tuned are searched again.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
from tvm import tirx

from ....targets import Target
from ...base import PassReport
from .bridge import Bridge, bridge_kernel, checked, choose
from ..gensor.cpu_model import CpuSpace
from ..measure.database import TuningDatabase
from ..gensor.cpu import RESTARTS, Choice, GensorCpu, schedule_kernels_gensor, seed_of, target_key, tuned_key
from ..measure.timing import Tally, can_measure, time_candidates, where_measured
from ..gensor.plan import ORDERS, PADS, REDUCE, TilePlan
from .reuse import ReusePool, Source, adapt, features, reuse_tree
from .progress import Progress
from ..gensor.walk import State, construct
from ..gensor.workload import Workload, func_key

TRIALS_PER_KERNEL = 24      # level 3's default budget: this many programs per tunable kernel
BATCH, RANDOM = 8, 2        # programs timed per round, of which picked at random
CHILDREN = 64               # mutants drawn per round before the cost model ranks them
PARENTS = 4
GAIN = 0.98                 # a child must be 2% faster than the best's fastest time


@dataclass
class Task:
    """One kernel's search: its space, what was measured, and the best program so far."""

    name: str
    func: tirx.PrimFunc
    key: str
    space: CpuSpace
    record: dict
    best: TilePlan | None                 # None: the rule-based schedule is the best
    best_s: float
    start_s: float
    measured: dict[TilePlan, float] = field(default_factory=dict)
    trials: int = 0
    stale_rounds: int = 0
    exhausted: bool = False
    seeds: list[TilePlan] = field(default_factory=list)   # Gensor's best-estimated plans (the population)
    baseline: tirx.PrimFunc | None = None # the rule-based schedule: every round's correctness reference
    best_func: tirx.PrimFunc | None = None  # `best` lowered, timed again in every round
    parent: "Task | None" = None          # ETO reuse: the kernel whose tuned program it starts from
    source: Source | None = None          # ... or another model's tuned program (the database's)
    cap: int = 0                          # most programs it may time (0: no cap)
    adapted: bool = False                 # the parent's tuned program was tried
    bridge: tuple[str, str] | None = None # an ETO bridge (never deployed): the two kernels it joins
    timing: Target | None = None          # what its candidates are timed on (GensorCpu.timing_target)

    def open(self) -> bool:
        return not self.exhausted and not (self.cap and self.trials >= self.cap)

    def settled(self, share: int) -> bool:
        """The search has had its share, run out, or stopped gaining: children may start from it."""
        return not self.open() or self.trials >= share or self.stale_rounds >= 2

    def weight(self) -> float:
        return self.best_s * 0.5 ** self.stale_rounds if self.open() else 0.0

    def best_plan(self) -> TilePlan | None:
        """The program a kernel reusing this one starts from: the best, or the fastest tile plan
        timed when the rules' schedule won (a tile plan is what adapts to other extents)."""
        timed = [p for p, s in self.measured.items() if s < math.inf]
        return self.best or min(timed, key=lambda p: self.measured[p], default=None)


@dataclass
class Budget:
    trials: int                 # programs to time for the whole model (0: no limit)
    seconds: float              # wall time for the whole model (0: no limit)

    def room(self, used: int) -> int:
        """Programs a round may still time."""
        return min(BATCH, self.trials - used) if self.trials else BATCH

    def left(self, used: int, t0: float) -> bool:
        return ((not self.trials or used < self.trials)
                and (not self.seconds or time.perf_counter() - t0 < self.seconds))

    def describe(self) -> str:
        parts = ([f"{self.trials} programs"] if self.trials else []) + ([f"{self.seconds:g} s"] if self.seconds else [])
        return " / ".join(parts)


def mutate(space: CpuSpace, plan: TilePlan, rng: np.random.Generator) -> TilePlan:
    """One or two random moves: a tile to a neighbouring candidate, the chunk loop's order, or
    (kernels that offer it) where the padding is computed."""
    tiles = [list(r) for r in plan.tiles]
    order, pad = plan.order, plan.pad
    for _ in range(1 + int(rng.random() < 0.4)):
        if rng.random() < 0.15 and any(k == REDUCE and e > 1 for k, e in zip(space.wl.kinds, space.extents)):
            order = ORDERS[1 - ORDERS.index(order)]
            continue
        if space.wl.pad_choice and rng.random() < 0.15:
            pad = str(rng.choice([p for p in space.wl.pads if p != pad]))
            continue
        sites = [(d, k) for d in range(len(tiles)) for k in range(len(tiles[d]))
                 if len(space.candidates(d, k, space.extents[d] if k == 0 else tiles[d][k - 1])) > 1]
        if not sites:
            break
        d, k = sites[rng.integers(len(sites))]
        cands = space.candidates(d, k, space.extents[d] if k == 0 else tiles[d][k - 1])
        i = cands.index(tiles[d][k]) if tiles[d][k] in cands else 0
        step = int(rng.choice([-1, 1])) if rng.random() < 0.8 else int(rng.integers(-len(cands), len(cands)))
        tiles[d][k] = cands[min(max(i + step, 0), len(cands) - 1)]
        _repair(space, tiles, d)
    return replace(plan, tiles=tuple(tuple(r) for r in tiles), order=order, pad=pad)


def _repair(space: CpuSpace, tiles: list[list[int]], d: int) -> None:
    """Each level's tile of iterator d becomes the candidate nearest to it that divides the one above."""
    parent = space.extents[d]
    for k, t in enumerate(tiles[d]):
        cands = space.candidates(d, k, parent)
        if t not in cands:
            tiles[d][k] = min(cands, key=lambda c: (abs(math.log(c / t)), c))
        parent = tiles[d][k]


def _state(plan: TilePlan) -> State:
    return State(plan.tiles, len(plan.levels) - 1)


class Tuner:
    def __init__(self, g: GensorCpu, budget: Budget, log: Callable[[str], None]):
        self.g, self.budget, self.log = g, budget, log
        self.used, self.t0 = 0, time.perf_counter()

    def task(self, name: str, func: tirx.PrimFunc, wl: Workload) -> Task | None:
        """The search of a Gensor kernel (`wl` its workload) from its level-2 record; None when
        it was tuned before (the database replays it) or level 2 could not time it."""
        timing = self.g.timing_target(func)
        warm_key = func_key(func, self.g.target_key)               # level 2's walk seed
        key = warm_key if timing is self.g.target else func_key(func, target_key(timing, self.g.hw))
        rec = self.g.db.get(key, measured_only=True, kind="gensor-cpu")
        if rec is None or self.g.db.get(tuned_key(key), kind="gensor-cpu") is not None:
            return None
        choice = Choice.from_record(rec)
        best_ms = choice.measured_ms if choice.source == "gensor" else choice.rules_ms
        if best_ms is None or choice.plan is None:
            return None
        space = CpuSpace(replace(wl, key=key), self.g.hw)
        best = choice.plan if choice.source == "gensor" else None
        t = Task(name, func, key, space, rec, best, best_ms / 1e3, best_ms / 1e3,
                 baseline=self.g.rules.schedule(func)[0], best_func=self.g.lower(func, best) if best else None,
                 timing=timing)
        t.measured[choice.plan] = choice.measured_ms / 1e3 if choice.measured_ms else math.inf
        ranked = construct(space, seed_of(warm_key), restarts=RESTARTS)
        t.seeds = [space.to_plan(st) for _, st in ranked[:PARENTS]]   # Gensor's population
        return t

    def bridge_task(self, br: Bridge, func: tirx.PrimFunc) -> Task:
        """The search of a bridge kernel: from scratch (the rules' schedule as the first
        incumbent), or its recorded program when an earlier build tuned it."""
        key = func_key(func, self.g.target_key)
        space = CpuSpace(replace(self.g.workload(func), key=key), self.g.hw)
        t = Task(br.name, func, key, space, {"kernel": br.name, "sketch": br.sketch}, None, math.inf, math.inf,
                 baseline=self.g.rules.schedule(func)[0], bridge=br.between)
        rec = self.g.db.get(tuned_key(key), kind="gensor-cpu")
        if rec is not None:                               # replayed: nothing to search
            t.exhausted = True
            if rec.get("plan"):
                t.best, t.best_s = TilePlan.from_dict(rec["plan"]), rec["measured_ms"] / 1e3
        else:
            t.seeds = [space.to_plan(st) for _, st in construct(space, seed_of(key), restarts=RESTARTS)[:PARENTS]]
        return t

    def round(self, t: Task) -> None:
        """Mutate, rank, time one batch next to the best; keep a faster child."""
        rng = np.random.default_rng(seed_of(t.key) + t.trials)
        parents = sorted(t.measured, key=lambda p: t.measured[p])[:PARENTS] + t.seeds
        forced = self._from_parent(t)
        children: dict[TilePlan, float] = {}
        for i in range(CHILDREN):
            child = mutate(t.space, parents[i % len(parents)], rng)
            if child not in t.measured and child not in children and t.space.valid(_state(child)):
                children[child] = t.space.estimate(_state(child))
        if not children and not forced:
            t.exhausted = True
            return
        ranked = forced + sorted((c for c in children if c not in forced),
                                 key=lambda p: (children[p], p.tiles, p.order, p.pad))
        size = min(self.budget.room(self.used), t.cap - t.trials if t.cap else BATCH)
        random = min(RANDOM, size // 4)
        pick, rest = ranked[:size - random], ranked[size - random:]
        pick += [rest[i] for i in sorted(rng.choice(len(rest), min(random, len(rest)), replace=False))]
        lowered = []
        for p in pick:
            try:
                lowered.append((p, self.g.lower(t.func, p)))
            except Exception:  # noqa: BLE001 - a plan the schedule primitives refuse is skipped
                t.measured[p] = math.inf
        if not lowered:
            t.stale_rounds += 1
            return
        incumbent = [t.best_func] if t.best is not None else []
        times = time_candidates([t.baseline] + incumbent + [f for _, f in lowered], t.timing or self.g.target,
                                time_first=t.best is None, tally=self.g.tally)
        best_now = times[1] if t.best is not None else times[0]
        t.best_s = min(t.best_s, best_now if best_now is not None else math.inf)
        self.used += len(lowered)
        t.trials += len(lowered)
        for (p, _), s in zip(lowered, times[1 + len(incumbent):]):
            t.measured[p] = s if s is not None else math.inf
        fastest, fastest_func = min(lowered, key=lambda x: t.measured[x[0]])
        if t.measured[fastest] < GAIN * t.best_s:
            t.best, t.best_func, t.best_s, t.stale_rounds = fastest, fastest_func, t.measured[fastest], 0
        else:
            t.stale_rounds += 1

    def _from_parent(self, t: Task) -> list[TilePlan]:
        """Once: the reuse parent's (or another model's) tuned program adapted to t's extents
        (unless t already timed it)."""
        src = t.parent.best_plan() if t.parent is not None else t.source.plan if t.source is not None else None
        if src is None or t.adapted:
            return []
        t.adapted = True
        state = adapt(t.space, src)
        pad = src.pad if src.pad in t.space.wl.pads else t.space.wl.pads[-1]
        plan = replace(t.space.to_plan(state), order=src.order, pad=pad) if state is not None else None
        return [plan] if plan is not None and plan not in t.measured else []

    def run(self, tasks: list[Task], share: int) -> None:
        """Rounds to the heaviest kernel (whose reuse parent, if any, has settled) until the budget
        is spent or no kernel is open."""
        progress = Progress(self.log, self.budget, len(tasks))
        while self.budget.left(self.used, self.t0):
            ready = [x for x in tasks if x.open() and (x.parent is None or x.parent.settled(share))]
            t = max(ready, key=lambda x: (x.trials < (x.cap or share), x.weight(), x.name), default=None)
            if t is None:
                break
            self.round(t)
            progress.update(self.used, t)
        progress.done()

    def record(self, t: Task) -> None:
        """The kernel's tuned program into the database (the rules' schedule when none beat it)."""
        if t.bridge is not None and t.exhausted and not t.trials:
            return                                        # replayed from the database
        rec = {k: v for k, v in t.record.items() if k != "meta"}
        rec["tuned"] = t.trials
        if t.bridge is not None:
            rec.update(bridge=list(t.bridge), measured=True, source="rules", plan=None)
        if t.parent is not None or t.source is not None:
            rec["reused_from"] = t.parent.name if t.parent is not None else t.source.name
        if t.best is not None:
            rec.update(source="gensor", plan=t.best.as_dict(), measured_ms=t.best_s * 1e3,
                       features=features(t.space, t.best))
        self.g.db.put(tuned_key(t.key), rec, "gensor-cpu",
                      target_key(t.timing, self.g.hw) if t.timing is not None else self.g.target_key)


def budget_of(opt, scratch: int, reused: int = 0) -> Budget:
    """The spec's budget; level 3 without one times TRIALS_PER_KERNEL programs per kernel
    searched from scratch and `reuse_cap` of that per kernel that starts from its reuse parent."""
    if opt.trials or opt.seconds:
        return Budget(opt.trials, opt.seconds)
    return Budget(TRIALS_PER_KERNEL * scratch + reuse_cap(TRIALS_PER_KERNEL) * reused, 0.0)


def reuse_cap(share: int) -> int:
    """Programs a kernel that starts from another's tuned program may time: an eighth of a
    share (3 of the default 24, as many as level 2's reuse times). ETO's reuse tuner measures
    tens of programs where Ansor measures 1,000; the kernel keeps its level-2 choice as the bar."""
    return max(share // 8, 1)


def tune_kernels(kernels: dict[str, tirx.PrimFunc], target: Target, opt, log: Callable[[str], None] = print,
                 tally: Tally | None = None) -> tuple[dict, PassReport]:
    """The `tuning` kernel pass: level 2's choices (into the database), then the measured search;
    the kernels are returned as they came (the schedule pass replays the database's programs)."""
    t0 = time.perf_counter()
    tally = tally if tally is not None else Tally()
    switches = {"windows": opt.enabled("window_rows"), "inline_pads": opt.enabled("pad_inline"),
                "cold_heavy": opt.enabled("cold_heavy")}
    _, level2 = schedule_kernels_gensor(kernels, target, opt.database, True, opt.top_k, opt.enabled("reuse"),
                                        tally=tally, **switches)
    g = GensorCpu(target, TuningDatabase(opt.database), True, opt.top_k, tally=tally, **switches)
    workloads = {n: wl for n, f in kernels.items() if (wl := g.workload(f)) is not None}
    tuner = Tuner(g, Budget(0, 0.0), log)
    tasks = {t.name: t for t in (tuner.task(n, kernels[n], wl) for n, wl in workloads.items()) if t is not None}
    bridges = _reuse_tree(tuner, tasks, opt.enabled("bridges")) if opt.enabled("reuse") else []
    searched = list(tasks.values()) + bridges
    reused = [t for t in searched if t.parent is not None or t.source is not None]
    tuner.budget = budget_of(opt, len(searched) - len(reused), len(reused))
    share = tuner.budget.trials // max(len(searched), 1) if opt.trials else TRIALS_PER_KERNEL
    for t in reused:
        t.cap = reuse_cap(share)
    tuner.run(searched, share)
    for t in searched:
        tuner.record(t)
    g.db.save()
    report = _report(list(tasks.values()), bridges, len(workloads), tuner, target, time.perf_counter() - t0)
    (ns, ts), (nr, tr) = level2.details["reuse"]["scratch"], level2.details["reuse"]["reused"]
    report.summary = (f"level 2 first ({ts + tr} programs timed: {ns} kernels from scratch, {nr} from another's "
                      f"program); then " + report.summary)
    report.details["level2"] = level2.details
    return kernels, report


def _reuse_tree(tuner: Tuner, tasks: dict[str, Task], with_bridges: bool) -> list[Task]:
    """ETO's tree over the kernels to search (with bridges: the greedy Steiner tree, bridge.py);
    the bridge tasks it adds. A root is searched with a full share, or starts from the database's
    nearest tuned program of its sketch (another model's) at the reuse cap; every other kernel
    starts from its parent's tuned program."""
    g = tuner.g
    others = ReusePool(g.db, g.target_key, tuned_only=True)
    nodes = {n: (t.record["sketch"], t.space.extents) for n, t in tasks.items() if t.record.get("sketch")}
    for n, (sketch, extents) in nodes.items():
        tasks[n].source = others.nearest(sketch, extents)
    outside = {n: float(reuse_cap(TRIALS_PER_KERNEL)) for n in nodes if tasks[n].source is not None}
    refused: set[tuple[str, tuple[int, ...]]] = set()
    while True:
        if with_bridges:
            parents, chosen = choose(nodes, TRIALS_PER_KERNEL, reuse_cap(TRIALS_PER_KERNEL), outside, refused)
        else:
            parents, chosen = reuse_tree(nodes, TRIALS_PER_KERNEL, reuse_cap(TRIALS_PER_KERNEL), outside)[0], []
        funcs = {br.name: bridge_kernel(tasks[br.between[0]].func, g.rules, br.extents) for br in chosen}
        bad = {(br.sketch, br.extents) for br in chosen if not checked(funcs[br.name], g, br.sketch, br.extents)}
        if not bad:
            break
        refused |= bad                  # a bridge whose kernel is not of its sketch: choose without it
    everything = tasks | {br.name: tuner.bridge_task(br, funcs[br.name]) for br in chosen}
    for name, parent in parents.items():
        if parent is not None:
            everything[name].parent, everything[name].source = everything[parent], None
    return [everything[br.name] for br in chosen]


def _report(tasks: list[Task], bridges: list[Task], gensor: int, tuner: Tuner, target: Target, seconds: float) -> PassReport:
    gained = sorted((t for t in tasks if t.best_s < t.start_s), key=lambda t: t.best_s - t.start_s)
    before, after = sum(t.start_s for t in tasks), sum(t.best_s for t in tasks)
    summary = (f"{len(tasks)} of {gensor} Gensor kernels searched ({gensor - len(tasks)} tuned earlier or not timed "
               f"at level 2, from the database), {tuner.used} programs timed on {where_measured(target)} "
               f"(budget {tuner.budget.describe()}); {len(gained)} faster than level 2")
    if tasks:
        summary += f", their sum {before * 1e3:.2f} -> {after * 1e3:.2f} ms"
    reused = [t for t in tasks if t.parent or t.source]
    if reused:
        others = sum(t.source is not None for t in reused)
        summary += (f"; ETO reuse: {len(tasks) - len(reused)} searched from scratch "
                    f"({sum(t.trials for t in tasks if t not in reused)} programs), {len(reused)} from a tuned "
                    f"program ({len(reused) - others} of this model, {others} of another model in the database; "
                    f"{sum(t.trials for t in reused)} programs, at most {reused[0].cap} each)")
    if bridges:
        summary += (f"; ETO bridges: {len(bridges)} tuned ({sum(t.trials for t in bridges)} programs), reused by "
                    f"{sum(any(t.parent is b for b in bridges) for t in tasks)} kernels")
    if gained:
        summary += "; most: " + ", ".join(f"{t.name} {t.start_s * 1e3:.3f} -> {t.best_s * 1e3:.3f} ms"
                                          for t in gained[:3])
    summary += f"; {seconds:.1f} s"
    details = {"budget": {"trials": tuner.budget.trials, "seconds": tuner.budget.seconds}, "timed": tuner.used,
               "kernels": {t.name: {"level2_ms": t.start_s * 1e3, "tuned_ms": t.best_s * 1e3, "trials": t.trials,
                                    "plan": t.best.describe() if t.best else "rules",
                                    "reused_from": t.parent.name if t.parent else t.source.name if t.source else None,
                                    "exhausted": t.exhausted} for t in tasks},
               "bridges": {t.name: {"between": list(t.bridge), "extents": list(t.space.extents), "trials": t.trials,
                                    "tuned_ms": t.best_s * 1e3, "reused_from": t.parent.name if t.parent else None,
                                    "reused_by": sorted(x.name for x in tasks if x.parent is t)} for t in bridges}}
    return PassReport("tuning", "applied", summary, details)


def can_tune(target: Target, opt) -> str | None:
    """Why the tuner cannot run for this CPU target and spec (None: it can)."""
    if opt.scheduler != "gensor" or not opt.enabled("schedule"):
        return "the tuner searches Gensor's space: needs optimize.scheduler gensor and the schedule pass"
    if not (opt.measure and can_measure(target)):
        return "the target's kernels cannot be timed (not this machine, no rpc device, or tuning.measure is off)"
    return None
