"""Row regions (CPU): a row-reduction kernel (softmax, layer norm) read only by a matmul (the
attention's P @ V, a pre-LN block's projection) joins it, and the row-region schedule
(schedule/rules_row.py) computes the reduction for each row tile inside the matmul's parallel
loop: the reduction's output no longer makes a round trip through memory, and the reduction
runs in the matmul's parallel region.

Taken only when the merged kernel gets the row-region rule and, where the target runs on this
machine, when it is measured faster than the two kernels it replaces, each timed with the
schedule the schedule pass will give it (Souffle refuses fusions that do not pay).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import tirx

from ...targets import can_run_here
from .graph import KernelGraph, kernel_graph
from .outline import Group, merged_kernels, outline

REDUCTION_RULES = ("row-reduction",)
MATMUL_RULES = ("tiled-reduction",)


@dataclass
class RowRegions:
    taken: int = 0
    refused: dict[str, str] = field(default_factory=dict)
    measured: list[dict] = field(default_factory=list)     # kernel, fused_us, separate_us
    timed: bool = False                                    # the target runs here and measuring is on
    skipped: str = ""                                      # why none were tried

    def line(self) -> str:
        text = f"row regions (softmax / layer norm into the matmul reading it): {self.taken}"
        if self.skipped:
            return f"{text} ({self.skipped})"
        if self.taken and not self.timed:
            text += " (not measured: the target does not run here or tuning.measure is off)"
        if self.measured:
            gain = sum(m["separate_us"] for m in self.measured) / max(sum(m["fused_us"] for m in self.measured), 1e-9)
            text += f" ({gain:.2f}x faster than the kernels they replace, measured)"
        return text


def row_regions(mod: tvm.IRModule, ctx, rules) -> tuple[tvm.IRModule, RowRegions]:
    """Merge each (row reduction, its only reader: a matmul) pair that schedules and pays."""
    out = RowRegions()
    if ctx.target.kind != "cpu":
        out.skipped = "CPU targets only in this version: GPU kernels would need grid-wide phases"
        return mod, out
    g = kernel_graph(mod)
    if g is None:
        return mod, out
    timer = _Timer(ctx) if ctx.opt.measure and can_run_here(ctx.target) else None
    out.timed = timer is not None
    try:
        return _merge(mod, g, _pairs(g, rules), rules, timer, out)
    finally:
        if timer:
            timer.save()                 # Gensor's measurements, for the schedule pass to reuse


def _merge(mod: tvm.IRModule, g: KernelGraph, candidates: list, rules, timer, out: RowRegions):
    for _ in range(2):                           # a second round without the refused pairs
        if not candidates:
            return mod, out
        groups = [Group(f"gf_row_{g.calls[c].name.removeprefix('gf_')}"[:80] + f"_{k}", (r, c), (c,), c)
                  for k, (r, c) in enumerate(candidates)]
        fused_mod = outline(mod, g, groups)
        keep = []
        for (r, c), func in zip(candidates, merged_kernels(fused_mod, g, groups)):
            why = _refusal(g, r, c, func, rules, timer, out)
            if why:
                out.refused[f"{g.bindings[c].var.name}={g.calls[r].name}+{g.calls[c].name}"] = why
            else:
                keep.append((r, c))
        if len(keep) == len(candidates):
            out.taken = len(keep)
            return fused_mod, out
        candidates = keep
        out.measured = []
    return mod, out


def _pairs(g: KernelGraph, rules) -> list[tuple[int, int]]:
    pairs = []
    for r, call in g.calls.items():
        readers = g.consumers[r]
        if r in g.returned or len(readers) != 1 or readers[0] not in g.calls:
            continue
        c = readers[0]
        if rules.rule(call.prim) in REDUCTION_RULES and rules.rule(g.calls[c].prim) in MATMUL_RULES:
            pairs.append((r, c))
    return pairs


def _mismatch(target, func: tirx.PrimFunc) -> str:
    """Why the row-region rule does not take a merged kernel (its RuleMismatch text)."""
    from tvm import s_tir

    from ..schedule.rules_cpu import CpuRules

    try:
        CpuRules(target).row_region(s_tir.Schedule(func))
    except Exception as e:  # noqa: BLE001 - the rule's refusal or a schedule primitive's error
        lines = str(e).strip().splitlines()
        return lines[-1][:160] if lines else type(e).__name__
    return "another rule came first"


def _refusal(g: KernelGraph, r: int, c: int, func, rules, timer, out: RowRegions) -> str:
    if func is None:
        return "not merged by FuseTIR"
    rule = rules.rule(func)
    if rule != "row-region":
        return f"no row-region schedule: {_mismatch(rules.target, func)}"
    if timer is None:
        return ""
    fused_s, separate_s = timer.compare(func, [g.calls[r].prim, g.calls[c].prim])
    if fused_s is None or separate_s is None:
        return "could not be timed"
    if fused_s >= separate_s:
        return f"slower when measured: {fused_s * 1e6:.0f} vs {separate_s * 1e6:.0f} us"
    out.measured.append({"kernel": g.calls[c].name, "fused_us": round(fused_s * 1e6, 1),
                         "separate_us": round(separate_s * 1e6, 1)})
    return ""


class _Timer:
    """Times kernels on this machine as the schedule pass will schedule them (Gensor's measured
    choice or the rules), once per kernel structure. Each decision is recorded in the tuning
    database, so a rebuild takes the same fusions (timings on a busy machine flip close calls)."""

    def __init__(self, ctx):
        from ..schedule.database import TuningDatabase
        from ..schedule.gensor import GensorCpu, _target_key
        from ..schedule.hardware import cpu_hardware
        from ..schedule.rules_cpu import CpuRules

        opt = ctx.opt
        self.target = ctx.target
        self.db = TuningDatabase(opt.database)
        self.gensor = GensorCpu(ctx.target, self.db, True, opt.top_k) if opt.scheduler == "gensor" else None
        self.rules = CpuRules(ctx.target)
        self.target_key = f"row-region/{opt.scheduler}/" + _target_key(ctx.target, cpu_hardware(ctx.target))
        self.seen: dict[int, list] = {}

    def compare(self, fused: tirx.PrimFunc, parts: list[tirx.PrimFunc]) -> tuple[float | None, float | None]:
        """(seconds of the merged kernel, seconds of the parts together), from the database when
        this merge was timed before."""
        from ..schedule.workload import func_key

        key = func_key(fused, self.target_key)
        rec = self.db.get(key)
        if rec is not None:
            return rec["fused_s"], rec["separate_s"]
        times = [self._time(f) for f in parts]
        result = self._time(fused), None if any(t is None for t in times) else sum(times)
        if None not in result:
            self.db.put(key, {"fused_s": result[0], "separate_s": result[1], "measured": True})
        return result

    def _time(self, func: tirx.PrimFunc) -> float | None:
        from ..schedule.measure import time_candidates

        h = tvm_ffi.structural_hash(func)
        for f, t in self.seen.get(h, []):
            if tvm_ffi.structural_equal(f, func):
                return t
        scheduled = self.gensor.schedule(func)[0] if self.gensor else self.rules.schedule(func)[0]
        t = time_candidates([scheduled], self.target)[0]
        self.seen.setdefault(h, []).append((func, t))
        return t

    def save(self) -> None:
        self.db.save()
