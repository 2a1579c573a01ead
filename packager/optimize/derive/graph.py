"""The `derive` pass: EinNet's derivations applied to the Relax graph where they pay off.

Per operator shape (sites.py: ConvTranspose, where TVM's lowering wastes most work: it convolves
a zero-inserted input, so a stride-2 layer does 4x the multiply-adds it needs; and Conv, where
only timing can tell, so at optimize.level 3):
1. the operator's canonical expression (sites.py, operators.py);
2. the derivation search (search.py), the candidates in GEMM layout (layout.py) and their matmul
   scopes converged to plain matmuls (converge.py);
3. the best candidate by the roofline estimate against the operator as built without it; a
   candidate estimated ESTIMATE_MARGIN x slower is refused without timing (the operator's own
   kernel is often far from its roofline, so a close estimate is timed, not trusted);
4. measured on this machine (or the target's RPC device) against the operator's own kernel,
   both scheduled by Gensor; taken only when faster;
5. emitted: GEMM scopes as relax.matmul over reshapes (the weight re-laid at build time), every
   other scope as an eOperator kernel (TE), so layout packing, fusion and Gensor see them as
   ordinary ops.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ... import progress
from ..base import PassReport
from ..relax_util import is_const, rewrite_functions
from ..schedule.contract import KernelScheduler
from ..schedule.hardware import Hardware
from .codegen import compute, scopes_in_order, tensors_of
from .converge import converge, matmul_shape
from .cost import estimate_ms
from .expr import Scope, Tensor
from .layout import Relaid, to_gemm_layout
from .match import instantiate, operands
from .search import MAX_DEPTH, Candidate, derive
from .sites import OPS, frontend, site_key

SEARCH_SECONDS = 20.0
ESTIMATE_MARGIN = 1.5
DECISIONS = "derive-v2"      # the database key's prefix: v2 since eOperators sum over windows (window.py)


@dataclass
class Site:
    """One operator the pass looked at, and what it decided."""

    op: str
    shape: str
    taken: bool = False
    why: str = ""
    states: int = 0
    pruned: int = 0
    candidates: int = 0
    steps: list[str] = field(default_factory=list)
    original_ms: float | None = None       # measured (or estimated) time of the operator's own kernel
    derived_ms: float | None = None
    measured: bool = False
    program: Scope | None = None
    relaid: dict[str, Relaid] = field(default_factory=dict)

    def record(self) -> dict:
        r = {k: getattr(self, k) for k in ("op", "shape", "taken", "why", "states", "pruned", "candidates", "steps",
                                           "measured")}
        r.update(original_ms=_round(self.original_ms), derived_ms=_round(self.derived_ms))
        return r


def _round(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None


def decide(call: relax.Call, scheduler: KernelScheduler, seconds: float = SEARCH_SECONDS,
           time_convs: bool = False) -> Site:
    """Search, rank, estimate and (where it can) time one operator; `time_convs`: Conv sites are
    searched (they are decided by timing alone, sites.py). A measured decision is recorded in the
    tuning database: a rebuild replays a refusal without searching, and a taken rewrite without
    timing (its program is searched again: the search is deterministic)."""
    measure = scheduler.measuring
    operator, why = frontend(call)
    site = Site(OPS[call.op.name], " * ".join(_shape_text(arg) for arg in call.args[:2]))
    if operator is None:
        site.why = why
        return site
    if operator.timed_only and not (measure and time_convs):
        site.why = "not searched: a conv is derived only where timed, at optimize.level 3"
        return site
    db, target_key = (scheduler.database(), scheduler.target_key()) if measure else (None, "")
    key = f"{DECISIONS}/{target_key}/{operator.key}"
    replayed = db.get(key, kind="derive") if db is not None else None
    if replayed is not None and not replayed["taken"]:
        return _replay(site, replayed)
    _search(site, operator, scheduler.hardware(), seconds)
    if replayed is not None and site.program is not None:
        return _replay(site, replayed)            # taken before: the program again, no timing
    if site.program is not None:
        _judge(site, operator, scheduler)
    if db is not None:
        db.put(key, site.record(), "derive", target_key)
        db.save()
    return site


def _judge(site: Site, operator, scheduler: KernelScheduler) -> None:
    """Taken when timed faster (or, where nothing is timed, estimated faster); a candidate
    estimated ESTIMATE_MARGIN x slower is not timed."""
    measure = scheduler.measuring
    if site.derived_ms >= site.original_ms * (ESTIMATE_MARGIN if measure else 1.0):
        site.why = "estimated slower" if measure else "estimated no faster (not measured)"
    elif measure:
        from .timing import time_against_original
        site.original_ms, site.derived_ms = time_against_original(
            operator.original(scheduler.target.vector_lanes_f32), site.program, site.relaid, scheduler)
        site.measured = True
        site.taken = site.derived_ms < site.original_ms
        site.why = "measured faster" if site.taken else "measured no faster"
    else:
        site.taken, site.why = True, "estimated faster (not measured)"


def _search(site: Site, operator, hw: Hardware, seconds: float) -> None:
    """The derivation search and the cheapest emittable candidate, estimated (site updated)."""
    result = derive(operator.expr, MAX_DEPTH, seconds=seconds)
    site.states, site.pruned, site.candidates = result.states, result.pruned, len(result.candidates)
    best = best_candidate(result.candidates, hw)
    if best is None:
        site.why = f"no candidate lowers to matmul + eOperators ({len(result.candidates)} found)"
        return
    est, cand, program, relaid = best
    site.steps, site.program, site.relaid = cand.steps + converging_steps(program), program, relaid
    site.original_ms, site.derived_ms = operator.original_estimate_ms(hw), est


def _replay(site: Site, rec: dict) -> Site:
    """A recorded decision (the site's own search, if any, kept for the program)."""
    for k in ("taken", "why", "states", "pruned", "candidates", "steps", "measured", "original_ms", "derived_ms"):
        setattr(site, k, rec[k])
    site.why += " (from the tuning database)"
    return site


def _shape_text(arg) -> str:
    return "x".join(str(int(d)) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in arg.ty.shape)


def best_candidate(candidates: list[Candidate], hw) -> tuple[float, Candidate, Scope, dict[str, Relaid]] | None:
    """(estimate ms, candidate, its program in GEMM layout, re-laid weights) of the cheapest
    candidate that lowers to matmul + eOperators (the shorter derivation on a tie)."""
    best = None
    for cand in candidates:
        program, relaid = to_gemm_layout(cand.program, {"W"})
        if not _emittable(program):
            continue
        est = estimate_ms(program, hw)
        if best is None or est < best[0] or (est == best[0] and len(cand.steps) < len(best[1].steps)):
            best = (est, cand, program, relaid)
    return best


def _emittable(program: Scope) -> bool:
    """Every matmul-class scope converges to a plain matmul (else it would lower as a generic TE
    kernel, which the search did not price)."""
    return all(p.kind != "matmul" or converge(p.scope) is not None for p in instantiate(program))


def converging_steps(program: Scope) -> list[str]:
    """The converging derivation of each matmul scope, as step names (EinNet's second stage)."""
    return [step.name for p in instantiate(program) if p.kind == "matmul" for step in converge(p.scope) or []]


@relax.expr_functor.mutator
class _Emit(relax.PyExprMutator):
    """Replaces each taken site's call by its derived program."""

    def __init__(self, mod: tvm.IRModule, taken: dict):
        super().__init__(mod)
        self.taken = taken

    def visit_call_(self, call):
        call = super().visit_call_(call)
        site = self.taken.get(site_key(call)) if isinstance(call, relax.Call) else None
        if site is None:
            return call
        return emit(self.builder_, site.program, site.relaid, call.args[0], call.args[1].value.numpy())


def emit(bb, program: Scope, relaid: dict[str, Relaid], data, weight: np.ndarray):
    """The program as Relax: GEMM scopes as matmul, the rest as TE kernels; returns the result."""
    values = {"X": data, "W": relax.const(weight)}
    values.update({name: relax.const(np.ascontiguousarray(np.transpose(weight, r.perm))) for name, r in relaid.items()})
    order = scopes_in_order(program)
    for i, s in enumerate(order):
        shape = matmul_shape(s)
        if shape is not None:
            expr = _matmul(bb, s, shape, values)
        else:
            sources = tensors_of(s)
            expr = bb.call_te(lambda *ts, s=s, sources=sources: compute(s, dict(zip(sources, ts)), "float32"),
                              *[_value(values, src) for src in sources],
                              primfunc_name_hint="derived")
        values[s] = bb.emit(expr) if i < len(order) - 1 else expr
    return values[program]


def _value(values: dict, src):
    """The Relax value of a tensor (by name) or of an emitted scope."""
    return values[src.name] if isinstance(src, Tensor) else values[src]


def _matmul(bb, s: Scope, shape, values: dict):
    """The converged matmul: its operands' and output's DLTs are reshapes (converge.py)."""
    batch, m, k, n = shape
    lead = [batch] if batch else []
    a, b = operands(s)
    mm = bb.emit(relax.op.matmul(_reshaped(bb, _value(values, a.source), [*lead, m, k]),
                                 _reshaped(bb, _value(values, b.source), [*lead, k, n])))
    return relax.op.reshape(mm, list(s.shape))


def _reshaped(bb, value, shape: list[int]):
    """A reshape; of a weight, done here at build time, so the layout pass sees the GEMM's weight
    as the constant it is and stores it in the panels its decision was timed with (timing.py)."""
    if is_const(value):
        return relax.const(np.ascontiguousarray(value.value.numpy().reshape(shape)))
    return bb.emit(relax.op.reshape(value, shape))


def derive_graph(mod: tvm.IRModule, scheduler: KernelScheduler, seconds: float = SEARCH_SECONDS,
                 time_convs: bool = False) -> tuple[tvm.IRModule, PassReport]:
    """Every ConvTranspose and Conv site decided once per shape, the taken ones rewritten; timed
    where the target's scheduler times (`scheduler.measuring`), else estimated."""
    calls: list = []
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, lambda e: calls.append(e) if isinstance(e, relax.Call) and
                                            getattr(e.op, "name", None) in OPS else None)
    keyed = [(call, site_key(call)) for call in calls]
    decided: dict[str, Site] = {}
    sites: list[Site] = []
    with progress.task(f"derive {scheduler.target.name}", len({key for _, key in keyed} - {None}), "shapes") as bar:
        for call, key in keyed:
            if key is not None and key in decided:
                continue
            site = decide(call, scheduler, seconds, time_convs)
            sites.append(site)
            if key is not None:
                decided[key] = site
                bar.advance()
    return rewrite(mod, {k: s for k, s in decided.items() if s.taken}), _report(sites)


def rewrite(mod: tvm.IRModule, taken: dict[str, Site]) -> tvm.IRModule:
    """Every call whose site key is in `taken` replaced by that site's derived program."""
    return rewrite_functions(_Emit(mod, taken), mod) if taken else mod


def _report(sites: list[Site]) -> PassReport:
    if not sites:
        return PassReport("derive", "applied", "no ConvTranspose or Conv in the model", {"sites": []})
    searched = [s for s in sites if s.states]
    parts = []
    for s in searched:
        gain = (f"{s.original_ms:.3g} -> {s.derived_ms:.3g} ms {'measured' if s.measured else 'est.'}"
                if s.derived_ms is not None else "")
        n_conv = sum(step.startswith("converge") for step in s.steps)
        derivation = f"{len(s.steps) - n_conv} explorative + {n_conv} converging steps" if s.steps else ""
        detail = "; ".join(x for x in (s.why, gain, derivation) if x)
        parts.append(f"{s.op} {s.shape}: {'taken' if s.taken else 'refused'} ({detail})")
    left: dict[tuple[str, str], int] = {}
    for s in sites:
        if not s.states:
            left[s.op, s.why] = left.get((s.op, s.why), 0) + 1
    parts += [f"{n} {op} shape(s) left: {why}" for (op, why), n in left.items()]
    states, pruned = sum(s.states for s in sites), sum(s.pruned for s in sites)
    rate = f"{pruned / states:.0%}" if states else "0%"
    summary = (f"{sum(s.taken for s in sites)} of {len(sites)} operator shape(s) rewritten (Matmul + eOperators); "
               f"search: {states} states, {rate} pruned by fingerprint; " + "; ".join(parts))
    return PassReport("derive", "applied", summary, {"sites": [s.record() for s in sites]})
