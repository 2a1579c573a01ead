"""Schedule reuse (ETO) for Gensor on CPU targets: a kernel whose sketch a measured kernel shares
is tuned from that kernel's program instead of from scratch.

* Sketch: the anchor's iterator kinds, vector iterator, every buffer's index-step pattern
  (strides and dilations included) and flops per point; two kernels with one sketch differ
  only in their loop extents (ETO's "same type and sketch set").
* Reuse condition (ETO Definition 2): same sketch, and the extents all <= or all >= the source's,
  loop by loop (nothing needs to divide anything).
* Reuse tuner (ETO Section 5, for CPU tile plans): the source's plan adapted to the new extents
  (each tile the nearest valid one, so the micro-kernel, L1 chunk and per-task work are kept)
  plus the best-estimated walk candidate whose parallel tasks (ETO's B) and total L1 footprint
  (ETO's M) lie in ETO's ranges [r1, r2] and [1, r2] around the source's, plus the cost model's
  own best plan. Those REUSE_TRIALS programs are timed (the rule-based schedule runs once,
  untimed, as the correctness reference) instead of Gensor's top-k plus the rules. The model's
  best is there because the adapted program alone loses: measured on the zoo with a shared
  database, BERT-base's FFN matmuls took 15.5 ms from a BERT-mini source's adapted program
  (no walk candidate fell in the ranges) against 6.6 ms from top-k.
* Reuse graph (ETO Section 6): within one schedule pass, every kernel is a node; the root's edge
  costs a scratch tuning's trials, a reuse edge the reuse tuner's; the minimum-cost arborescence
  (Edmonds, networkx) says which kernels are tuned from scratch and which reuses which, and the
  kernels are tuned in its order. Kernels tuned on demand (global fusion's timing) take the
  nearest measured source already known: this build's or the tuning database's (across models).
  The level-3 tuner (tune.py) builds the same graph over the kernels it searches. Layout
  candidates never reuse (they are compared with each other). ETO's bridge operators are built
  by the level-3 tuner only (bridge.py); here a kernel no source dominates is tuned from scratch.
* On by default at level 3 only: level 2's top-k with reuse swung latency between cold builds.
* Same-workload reuse (pass `reuse_same`, on from level 2): without ETO's reuse, a kernel whose
  exact workload (sketch and extents) was measured before takes the reuse tuner's candidates
  from that source. That source is usually the layout search's bare conv in the same layouts;
  the schedule pass then times the conv again with its fused epilogue. Adapting changes
  nothing when the extents are equal, so the measured program itself is among the candidates.
  The rule-based schedule is always timed too: a fused epilogue can tip the balance to it when
  the bare kernel's Gensor plan won. BERT-base's FFN1 (matmul + GELU) was 8% slower when it was
  left untimed. A shape that has not been measured is still tuned from scratch.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from ..gensor.cpu_model import CpuSpace, prod
from ..gensor.plan import TilePlan
from ..gensor.walk import State
from ..gensor.workload import Workload

REUSE_TRIALS = 3              # programs timed when a kernel reuses another's (scratch: top-k + rules)


def sketch_of(wl: Workload) -> str:
    """What two kernels must share to reuse each other's programs: everything but the extents."""
    parts = [wl.kinds, wl.vector_axis, wl.flops_per_point,
             [(a.coef, a.is_output, a.elem_bytes, a.contiguous_axis) for a in wl.accesses]]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def reusable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """ETO's Definition 2 on extents: all <= or all >= loop by loop."""
    return len(a) == len(b) and (all(x <= y for x, y in zip(a, b)) or all(x >= y for x, y in zip(a, b)))


def distance(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """How far apart two iteration spaces are (sum of |log ratio| per loop): nearer sources first."""
    return sum(abs(math.log(x / y)) for x, y in zip(a, b))


@dataclass(frozen=True)
class Source:
    """A measured kernel another may reuse: its name (report), sketch, extents, chosen program and
    that program's features (ETO's B and M, with the iteration-space sizes the ranges need)."""

    name: str
    sketch: str
    plan: TilePlan
    rules_won: bool                 # the rule-based schedule beat Gensor's plans when measured
    features: dict                  # tasks, l1_bytes, points, reduce_points

    @property
    def extents(self) -> tuple[int, ...]:
        return self.plan.extents

    @staticmethod
    def from_record(name: str, rec: dict) -> "Source | None":
        if not (rec.get("sketch") and rec.get("plan") and rec.get("features") and rec.get("measured")):
            return None
        return Source(name, rec["sketch"], TilePlan.from_dict(rec["plan"]), rec.get("source") == "rules",
                      rec["features"])


def _b_and_m(space: CpuSpace, s: State) -> tuple[int, int]:
    """ETO's B (parallel tasks) and M (total L1 footprint, bytes) of a CPU tile plan."""
    tasks = space.counts(s)[0]
    return tasks, tasks * space.footprint(s, 1)


def _reduce_points(wl: Workload) -> int:
    return prod(wl.extents[d] for d in wl.reduce())


def features(space: CpuSpace, plan: TilePlan) -> dict:
    """B and M of a measured plan, and the sizes of the iteration space and its reduction the
    reuse ranges of a later kernel are computed from."""
    tasks, l1_bytes = _b_and_m(space, State(plan.tiles, len(plan.levels) - 1))
    return {"tasks": tasks, "l1_bytes": l1_bytes, "points": space.wl.points, "reduce_points": _reduce_points(space.wl)}


class ReusePool:
    """Measured sources by sketch: this build's kernels, and the database's records of the target
    (with `tuned_only`, the level-3 tuner's programs only)."""

    def __init__(self, db, target_key: str, tuned_only: bool = False):
        self.by_sketch: dict[str, list[Source]] = {}
        for key, rec in db.records.items():
            meta = rec.get("meta") or {}
            if tuned_only and "tuned" not in rec:
                continue
            if meta.get("kind") == "gensor-cpu" and meta.get("target") == target_key:
                src = Source.from_record(rec.get("kernel") or f"database:{key[:8]}", rec)
                if src is not None:
                    self.add(src)

    def add(self, src: Source) -> None:
        self.by_sketch.setdefault(src.sketch, []).append(src)

    def nearest(self, sketch: str, extents: tuple[int, ...]) -> Source | None:
        fits = [s for s in self.by_sketch.get(sketch, []) if reusable(extents, s.extents)]
        return min(fits, key=lambda s: (distance(extents, s.extents), s.name), default=None)

    def same(self, sketch: str, extents: tuple[int, ...]) -> Source | None:
        """A measured source of exactly this workload (sketch and extents), or None."""
        return min((s for s in self.by_sketch.get(sketch, []) if s.extents == tuple(extents)),
                   key=lambda s: s.name, default=None)


def adapt(space: CpuSpace, plan: TilePlan) -> State | None:
    """The source's tiles on the new extents: per iterator and level, the valid tile nearest (in
    log distance) to the source's; None when the result breaks a capacity limit. A source of the
    same extents is taken as it is: it ran and was timed (a window plan, gensor/window.py, may
    exceed the model's L1 footprint)."""
    if tuple(plan.extents) == tuple(space.extents) and tuple(plan.axes) == tuple(space.wl.axes):
        return State(tuple(plan.tiles), len(plan.levels) - 1)
    tiles = []
    for d, ext in enumerate(space.extents):
        row, parent = [], ext
        for k in range(len(plan.levels)):
            want = plan.tiles[d][k]
            parent = min(space.candidates(d, k, parent), key=lambda t: (abs(math.log(t / want)), -t))
            row.append(parent)
        tiles.append(tuple(row))
    state = State(tuple(tiles), len(plan.levels) - 1)
    return state if space.valid(state) else None


def in_ranges(space: CpuSpace, s: State, src: Source) -> bool:
    """ETO's Eqs. 1 and 3: B/B_src in [r1, r2] and M/M_src in [1, r2] (each as [min, max])."""
    wl, f0 = space.wl, src.features
    r1 = f0["reduce_points"] / max(_reduce_points(wl), 1)
    r2 = wl.points / f0["points"]
    tasks, m = _b_and_m(space, s)
    lo_b, hi_b = sorted((r1 * f0["tasks"], r2 * f0["tasks"]))
    lo_m, hi_m = sorted((f0["l1_bytes"], r2 * f0["l1_bytes"]))
    return lo_b <= tasks <= hi_b and lo_m <= m <= hi_m


def reuse_candidates(space: CpuSpace, ranked: list[tuple[float, State]], src: Source) -> list[tuple[float, State]]:
    """Up to REUSE_TRIALS (estimate, state): the adapted source plan, the best in range, and the
    cost model's best."""
    out: list[tuple[float, State]] = []
    adapted = adapt(space, src.plan)
    if adapted is not None:
        out.append((space.estimate(adapted), adapted))
    in_range = next(((est, st) for est, st in ranked if st.tiles != (adapted and adapted.tiles)
                     and in_ranges(space, st, src)), None)
    for cand in ([in_range] if in_range else []) + ranked[:1]:
        if cand[1].tiles not in {s.tiles for _, s in out}:
            out.append(cand)
    return out[:REUSE_TRIALS]


def reuse_order(nodes: dict[str, tuple[str, tuple[int, ...]]], scratch_trials: int,
                root_cost: dict[str, float] | None = None) -> dict[str, str | None]:
    """kernel -> the kernel it reuses (None: a root of the tree), from the minimum-cost
    arborescence over the reuse graph; `nodes` maps kernel -> (sketch, extents). A reuse edge
    costs REUSE_TRIALS plus a tie-break by distance, a root edge `scratch_trials` unless
    `root_cost` says less (a kernel already measured, or one with a source outside the graph)."""
    return reuse_tree(nodes, scratch_trials, REUSE_TRIALS, root_cost)[0]


def reuse_tree(nodes: dict[str, tuple[str, tuple[int, ...]]], scratch: float, reuse: float,
               root_cost: dict[str, float] | None = None) -> tuple[dict[str, str | None], float]:
    """(kernel -> the kernel it reuses or None, the tree's cost): the minimum-cost arborescence
    with root edges at `scratch` (or `root_cost`) and reuse edges at `reuse` plus a tie-break by
    distance (nearer sources first)."""
    import networkx as nx

    root_cost = root_cost or {}
    g = nx.DiGraph()
    g.add_node("")                                       # the root
    for a, (sk_a, ext_a) in nodes.items():
        g.add_edge("", a, weight=root_cost.get(a, float(scratch)))
        for b, (sk_b, ext_b) in nodes.items():
            if a != b and sk_a == sk_b and reusable(ext_a, ext_b):
                g.add_edge(b, a, weight=reuse + 1e-3 * distance(ext_a, ext_b))
    tree = nx.minimum_spanning_arborescence(g)
    cost = sum(d["weight"] for _, _, d in tree.edges(data=True))
    return {a: (None if p == "" else p) for p, a in tree.edges}, cost


def tree_order(parents: dict[str, str | None]) -> list[str]:
    """Kernels parents first (a reuse source is tuned before the kernels reusing it)."""
    order, done = [], set()

    def visit(k: str) -> None:
        if k in done:
            return
        if parents.get(k):
            visit(parents[k])
        done.add(k)
        order.append(k)
    for k in parents:
        visit(k)
    return order
