"""The `schedule` pass with the construction-based scheduler (Gensor) on CPU targets.

Per kernel with one reduction block (conv, matmul, pooling): the workload is read from the TIR,
seeded annealed walks build candidate tile plans over the CPU state space, the analytical model
ranks them, and when the target runs on this machine (or its RPC device) the top-k are timed together with the
rule-based schedule (the baseline); the fastest wins. Kernels without a reduction anchor
(softmax/layer-norm rows, element-wise) keep the rule-based schedules. Every choice goes into
the tuning database; a recorded choice is reused, so rebuilds are fast and deterministic.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, replace

from tvm import s_tir, tirx

from .... import progress
from ....targets import Target
from ...base import PassReport
from ..rules.cpu import CpuRules
from ..rules.int_dot import find_int_dot
from ..rules.winograd import stage as winograd_stage
from .cpu_lower import lower_cpu
from .cpu_model import REG, CpuSpace
from ..measure.database import TuningDatabase
from ..hardware import cpu_hardware, weight_heavy
from ..measure.timing import Tally, can_measure, time_candidates, where_measured
from ..rules.padding import offers_inline, offers_per_task
from .plan import PADS, TilePlan
from ..tuning.reuse import REUSE_TRIALS, ReusePool, Source, features, reuse_candidates, reuse_order, sketch_of, tree_order
from .walk import State, construct
from .window import window_plans
from .workload import Workload, analyze, func_key

RESTARTS = 12
PAD_VARIANTS = 2              # best-estimated plans also timed with their padding per task (padding.py)
BUDGET_SPENT_TOP_K = 2        # plans compiled per kernel once the build's timing budget is spent


def offered_pads(sch: s_tir.Schedule, anchor, inline: bool = True) -> tuple[str, ...]:
    """Where the kernel's padding stage may be computed (PADS; padding.py says which kernels);
    `inline`: the spec's pad_inline switch."""
    if not offers_per_task(anchor):
        return PADS[:1]
    return PADS if inline and offers_inline(sch, anchor) else PADS[:2]


def window_candidates(space: CpuSpace, windows: list[TilePlan],
                      plans: list[tuple[float, TilePlan]]) -> list[tuple[float, TilePlan]]:
    """A window kernel's register-blocked plans (window.py) not among `plans`, with their estimates."""
    seen = {(p.tiles, p.pad) for _, p in plans}
    return [(space.estimate(State(p.tiles, REG)), p) for p in windows if (p.tiles, p.pad) not in seen]


def with_pad_variants(plans: list[tuple[float, TilePlan]], wl: Workload, n: int) -> list[tuple[float, TilePlan]]:
    """`plans`, then the first `n` again with the kernel's preferred other placement of its
    padding (inline, else per task), where it offers one (the cost model does not tell them
    apart: measurement does)."""
    if not wl.pad_choice:
        return plans
    return plans + [(est, replace(plan, pad=wl.preferred_pad)) for est, plan in plans[:n]]


@dataclass
class Choice:
    """What the scheduler decided for one kernel (report + database record)."""

    source: str                       # "gensor" | "rules"
    plan: TilePlan | None
    estimate_ms: float | None
    measured_ms: float | None = None
    rules_ms: float | None = None
    candidates: int = 0
    reused: bool = False              # replayed from the tuning database
    trials: int = 0                   # programs timed to choose it
    reused_from: str | None = None    # the kernel whose program it was tuned from (ETO reuse)
    family: str = "walk"              # where the plan came from: Gensor's "walk", or "window" (window.py)

    def record(self) -> dict:
        return {"source": self.source, "plan": self.plan.as_dict() if self.plan else None,
                "estimate_ms": self.estimate_ms, "measured_ms": self.measured_ms, "rules_ms": self.rules_ms,
                "candidates": self.candidates, "measured": self.measured_ms is not None or self.rules_ms is not None,
                "trials": self.trials, "reused_from": self.reused_from, "family": self.family}

    @staticmethod
    def from_record(r: dict) -> "Choice":
        plan = TilePlan.from_dict(r["plan"]) if r.get("plan") else None
        return Choice(r["source"], plan, r.get("estimate_ms"), r.get("measured_ms"), r.get("rules_ms"),
                      r.get("candidates", 0), reused=True, reused_from=r.get("reused_from"),
                      family=r.get("family", "walk"))

    def summary(self) -> str:
        if self.source == "gensor" and self.plan:
            parts = [f"gensor{' window' if self.family == 'window' else ''} {self.plan.describe()}"]
        else:
            parts = ["rules (baseline faster)" if self.plan else "rules (no Gensor plan lowered or ran correctly)"]
        if self.estimate_ms is not None:
            parts.append(f"est {self.estimate_ms:.3f} ms")
        if self.measured_ms is not None:
            parts.append(f"measured {self.measured_ms:.3f} ms")
        if self.rules_ms is not None:
            parts.append(f"rules {self.rules_ms:.3f} ms")
        if self.trials:
            parts.append((f"reused {self.reused_from}, " if self.reused_from else "from scratch, ")
                         + f"{self.trials} timed")
        if self.reused:
            parts.append("from database")
        return ", ".join(parts)


def target_key(t: Target, hw) -> str:
    """Records are per target, per machine that timed them (a board's timings are its own) and per
    cache condition (measure/timing.py: warm, or flushed for models whose weights exceed the cache)."""
    key = f"{t.arch}/{t.isa}/{t.mcpu}/{hw.cores}c/{hw.level('L1').capacity}/{hw.level('L2').capacity}"
    key += "/cold-args" if getattr(t, "cold_weights", False) else ""   # timed with the arguments flushed
    return key + (f"/rpc:{t.rpc.key}" if t.rpc is not None else "")


def tuned_key(key: str) -> str:
    """Where the measured tuner's program for a kernel is recorded: level 3 replays it, level 2
    keeps its own choice under `key` (so `pack bench --ablate tuning` compares the two)."""
    return key + "#tuned"


def seed_of(key: str) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)


class GensorCpu:
    def __init__(self, target: Target, db: TuningDatabase, measure: bool, top_k: int, reuse: bool = False,
                 tuned: bool = False, tally: Tally | None = None, same: bool = False, windows: bool = True,
                 inline_pads: bool = True, cold_heavy: bool = True):
        self.target, self.db, self.tuned, self.windows, self.inline_pads = target, db, tuned, windows, inline_pads
        self.cold_heavy, self.cold_kernels = cold_heavy, 0     # weight-heavy kernels timed flushed (timing_target)
        self.tally = tally if tally is not None else Tally()        # what timing cost (the build's)
        self.rules = CpuRules(target)
        self.hw = cpu_hardware(target)
        self.measure = measure and can_measure(target)
        self.top_k = max(top_k, 1)
        self.target_key = target_key(target, self.hw)
        self.pool = ReusePool(db, self.target_key) if reuse and self.measure else None
        # same-workload reuse (ETO's reuse covers it when on): sources of the exact workload only
        self.same = ReusePool(db, self.target_key) if same and not reuse and self.measure else None
        self.sources: dict[str, Source] = {}          # this run's measured kernels by name
        self.rule_notes: dict[str, str] = {}          # kernels the rules took: their schedule line

    def workload(self, func: tirx.PrimFunc) -> Workload | None:
        """The anchor's workload with the rules' vector iterator (what the plans and sketches are
        of), None for a kernel without a tileable one-reduction anchor (the rules take it)."""
        sch = s_tir.Schedule(func)
        if find_int_dot(sch) is not None or winograd_stage(func) is not None:     # kernels with their own rule
            return None
        try:
            anchor = self.rules.prepare_anchor(sch)
            wl = analyze(sch, anchor.block, "")
        except Exception:  # noqa: BLE001 - not a tileable one-reduction kernel (0-d output, ...)
            return None
        vec_name = anchor.vec[0].var.name if anchor.vec else None
        return replace(wl, vector_axis=wl.axes.index(vec_name) if vec_name in wl.axes else -1,
                       pads=offered_pads(sch, anchor, self.inline_pads))

    def sketch(self, func: tirx.PrimFunc) -> tuple[str, tuple[int, ...]] | None:
        """(sketch, extents) of a Gensor kernel, None for the kernels the rules take."""
        wl = self.workload(func)
        return (sketch_of(wl), wl.extents) if wl is not None else None

    def schedule(self, func: tirx.PrimFunc, name: str = "", source: Source | None = None
                 ) -> tuple[tirx.PrimFunc, str, Choice | None]:
        """(scheduled kernel, rule name for the counts, the Gensor choice or None). With reuse on,
        the kernel is tuned from `source`'s program, or from the nearest measured kernel of its
        sketch, else from scratch."""
        wl = self.workload(func)
        if wl is None:
            out, info = self.rules.schedule(func)
            self.rule_notes[name] = info.summary()
            return out, info.rule, None
        timing = self.timing_target(func)
        self.cold_kernels += timing is not self.target
        timing_key = target_key(timing, self.hw)
        warm_key = func_key(func, self.target_key)                 # the walk's seed either way
        key = warm_key if timing is self.target else func_key(func, timing_key)
        name = name or f"kernel {key[:8]}"
        rec = self.tuned and self.db.get(tuned_key(key), measured_only=True, kind="gensor-cpu")
        rec = rec or self.db.get(key, measured_only=self.measure, kind="gensor-cpu")
        if rec is not None:
            self._remember(name, rec)
            choice = Choice.from_record(rec)
            return self._apply(func, choice), "gensor", choice
        wl = replace(wl, key=key)
        space = CpuSpace(wl, self.hw)
        ranked = construct(space, seed_of(warm_key), restarts=RESTARTS)
        windows = window_plans(space) if self.windows else []
        sketch = sketch_of(wl)
        if self.pool is not None and source is None:
            source = self.pool.nearest(sketch, wl.extents)
        elif self.same is not None and source is None:
            source = self.same.same(sketch, wl.extents)
        if self.measure and source is not None:
            plans = [(est, space.to_plan(st)) for est, st in reuse_candidates(space, ranked, source)]
            choice = self._choose(func, with_pad_variants(plans, wl, 1), len(ranked),
                                  time_rules=source.rules_won or self.same is not None, timing=timing)
            choice.reused_from = source.name
        else:
            plans = [(est, space.to_plan(st)) for est, st in ranked[:self.top_k if self.measure else 1]]
            if self.measure:
                plans = with_pad_variants(plans, wl, PAD_VARIANTS) + window_candidates(space, windows, plans)
            else:                                    # the analytical choice: the best estimate of either
                plans = sorted(plans + window_candidates(space, windows, plans), key=lambda ep: ep[0])
            choice = self._choose(func, plans, len(ranked), timing=timing)
        if choice.plan is not None and any(choice.plan.tiles == w.tiles for w in windows):
            choice.family = "window"
        record = choice.record()
        if choice.plan is not None:
            record.update(sketch=sketch, features=features(space, choice.plan), kernel=name or None)
        self.db.put(key, record, "gensor-cpu", timing_key)
        self._remember(name, record)
        return self._apply(func, choice), "gensor", choice

    def _remember(self, name: str, record: dict) -> None:
        """A measured choice becomes a reuse source for the kernels tuned after it."""
        pool = self.pool or self.same
        src = Source.from_record(name or "", record) if pool is not None else None
        if src is not None:
            pool.add(src)
            if name:
                self.sources[name] = src

    def timing_target(self, func: tirx.PrimFunc) -> Target:
        """The target a kernel's candidates are timed on: with the caches flushed before every
        run for a kernel whose weights outweigh what it reads and writes (weight_heavy), as the
        model leaves its weights; else the build's condition (warm, or flushed for a model whose
        weights exceed the last-level cache)."""
        if self.measure and self.cold_heavy and not getattr(self.target, "cold_weights", False) \
                and weight_heavy(func, self.hw):
            return replace(self.target, cold_weights=True)
        return self.target

    def _choose(self, func: tirx.PrimFunc, plans: list[tuple[float, TilePlan]], n: int,
                time_rules: bool = True, timing: Target | None = None) -> Choice:
        """Time the plans (and the rule-based schedule, which is always the correctness reference
        and, with `time_rules`, a candidate) on `timing` (the build's target by default) and keep
        the fastest correct one."""
        lowered = []
        for est, plan in plans:
            try:
                lowered.append((est, plan, self.lower(func, plan)))
            except Exception:  # noqa: BLE001 - a plan the schedule primitives refuse is skipped
                continue
        if not lowered:
            return Choice("rules", None, None, candidates=n)
        if not self.measure:
            est, plan, _ = lowered[0]
            return Choice("gensor", plan, est * 1e3, candidates=n)
        if self.tally.over_budget():              # the build's timing budget is spent: fewer to compile
            lowered = lowered[:BUDGET_SPENT_TOP_K]
        baseline, _ = self.rules.schedule(func)
        times = time_candidates([baseline] + [f for _, _, f in lowered], timing or self.target, time_first=time_rules,
                                tally=self.tally)
        rules_s = times[0]
        trials = len(lowered) + (1 if time_rules else 0)
        timed = [(t, est, plan) for t, (est, plan, _) in zip(times[1:], lowered) if t is not None]
        if not timed:
            return Choice("rules", None, None, None, rules_s * 1e3 if rules_s else None, n, trials=trials)
        t, est, plan = min(timed, key=lambda x: x[0])
        if rules_s is not None and rules_s < t:
            return Choice("rules", plan, est * 1e3, t * 1e3, rules_s * 1e3, n, trials=trials)
        return Choice("gensor", plan, est * 1e3, t * 1e3, rules_s * 1e3 if rules_s else None, n, trials=trials)

    def lower(self, func: tirx.PrimFunc, plan: TilePlan) -> tirx.PrimFunc:
        sch = s_tir.Schedule(func)
        anchor = self.rules.prepare_anchor(sch)
        lower_cpu(sch, self.rules, anchor, plan)
        return sch.mod["main"]

    def _apply(self, func: tirx.PrimFunc, choice: Choice) -> tirx.PrimFunc:
        if choice.source == "gensor" and choice.plan is not None:
            try:
                return self.lower(func, choice.plan)
            except Exception:  # noqa: BLE001 - a stale database record: fall back to the rules
                choice.source = "rules"
        return self.rules.schedule(func)[0]


def _reuse_tree(g: GensorCpu, kernels: dict[str, tirx.PrimFunc]) -> dict[str, str | None]:
    """ETO's reuse graph over the pass's Gensor kernels: kernel -> the kernel of the pass it
    reuses (None: a root). A root is free when the database holds the kernel, costs the reuse
    tuner's trials when a measured kernel outside the pass (the layout search's, the database's)
    is its source, and a scratch tuning's otherwise."""
    nodes, root_cost = {}, {}
    for name, func in kernels.items():
        sk = g.sketch(func)
        if sk is None:
            continue
        nodes[name] = sk
        if g.db.get(func_key(func, g.target_key), measured_only=True, kind="gensor-cpu") is not None:
            root_cost[name] = 0.0
        elif g.pool.nearest(*sk) is not None:
            root_cost[name] = float(REUSE_TRIALS)
    return reuse_order(nodes, g.top_k + 1, root_cost)


def schedule_kernels_gensor(kernels: dict[str, tirx.PrimFunc], target: Target, database=None,
                            measure: bool = True, top_k: int = 6, reuse: bool = False, tuned: bool = False,
                            tally: Tally | None = None, same: bool = False,
                            windows: bool = True, inline_pads: bool = True,
                            cold_heavy: bool = True) -> tuple[dict, PassReport]:
    """The `schedule` pass (scheduler: gensor) for one CPU target; with `reuse` (ETO) kernels are
    tuned in the reuse tree's order, each non-root from its parent's program; with `tuned` (level
    3) the measured tuner's programs are replayed where it recorded one."""
    db = TuningDatabase(database)
    g = GensorCpu(target, db, measure, top_k, reuse, tuned, tally, same, windows, inline_pads, cold_heavy)
    parents = _reuse_tree(g, kernels) if g.pool is not None else {}
    t0 = time.perf_counter()
    results = {}
    with progress.task(f"schedule {target.name} (Gensor{', measured' if g.measure else ''})", len(kernels),
                       "kernels") as bar:
        for name in tree_order(parents) + [n for n in kernels if n not in parents]:
            parent = parents.get(name)
            results[name] = g.schedule(kernels[name], name, source=g.sources.get(parent) if parent else None)
            bar.advance()
    out, per_kernel, counts = {}, {}, {}
    tally = {"scratch": [0, 0], "reused": [0, 0]}                  # kernels, programs timed
    pads = {pad: 0 for pad in PADS[1:]}                             # plans padding per task / inline
    rows = 0                                                        # window plans (window.py)
    for name in kernels:
        out[name], rule, choice = results[name]
        if choice is None:
            per_kernel[name] = g.rule_notes.get(name, rule)
            counts[rule] = counts.get(rule, 0) + 1
            continue
        per_kernel[name] = choice.summary()
        label = "gensor" if choice.source == "gensor" else "rules (kept over gensor)"
        counts[label] = counts.get(label, 0) + 1
        if choice.source == "gensor" and choice.plan is not None and choice.plan.pad in pads:
            pads[choice.plan.pad] += 1
        rows += choice.source == "gensor" and choice.family == "window"
        if choice.trials:
            row = tally["reused" if choice.reused_from else "scratch"]
            row[0], row[1] = row[0] + 1, row[1] + choice.trials
    db.save()
    if g.measure:
        how = f"top-{g.top_k} + rules measured on {where_measured(target)}"
    else:
        how = "analytical choice (" + ("measure: false" if not measure else "target does not run here and has no rpc device") + ")"
    summary = (f"{len(kernels)} kernels: " + ", ".join(f"{n} {r}" for r, n in sorted(counts.items()))
               + "".join(f" ({n} padding {'per task' if pad == PADS[1] else 'inlined into the reads'})"
                         for pad, n in pads.items() if n)
               + (f" ({rows} as rows of output positions in registers, window.py)" if rows else "")
               + (f" ({g.cold_kernels} weight-heavy, chosen on timings with the caches flushed)" if g.cold_kernels else "")
               + f"; {how}; hardware model {g.hw.name}, {g.hw.cores} cores, L1 {g.hw.level('L1').capacity >> 10} KB, "
               f"L2 {g.hw.level('L2').capacity >> 10} KB")
    if g.pool is not None:
        (ns, ts), (nr, tr) = tally["scratch"], tally["reused"]
        summary += (f"; ETO reuse: {ns} kernels tuned from scratch ({ts} programs timed), {nr} from another's program "
                    f"({tr} timed; from scratch they would take {nr * (g.top_k + 1)})")
    elif g.same is not None:
        (nr, tr) = tally["reused"]
        summary += (f"; same-workload reuse: {nr} kernels from a measured program of their exact workload ({tr} "
                    f"programs timed; from scratch they would take {nr * (g.top_k + 1)})")
    summary += f"; {time.perf_counter() - t0:.1f} s"
    details = {"scheduler": "gensor", "rules": counts, "kernels": per_kernel, "database": str(db.path),
               "pad_per_task": pads[PADS[1]], "pad_inline": pads[PADS[2]], "window_rows": rows,
               "cold_heavy": g.cold_kernels,
               "reuse": {"on": g.pool is not None, "same": g.same is not None, "tree": parents,
                         "scratch": tally["scratch"],
                         "reused": tally["reused"]}}
    return out, PassReport("schedule", "applied", summary, details)
