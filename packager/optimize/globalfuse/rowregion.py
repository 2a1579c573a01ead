"""Row regions (CPU): a row-reduction kernel (softmax, layer norm) read only by a matmul (the
attention's P @ V, a pre-LN block's projection) joins it, and the row-region schedule
(schedule/rules_row.py) computes the reduction for each row tile inside the matmul's parallel
loop: the reduction's output no longer makes a round trip through memory, and the reduction
runs in the matmul's parallel region.

Taken only when the merged kernel gets the row-region rule and, where the target runs on this
machine, is not measured slower than the two kernels it replaces beyond the timer's resolution
(timing.pays), each side timed with the schedule the schedule pass will give it (Souffle refuses
fusions that do not pay).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import tirx

from .graph import KernelGraph, kernel_graph
from .outline import Group, merged_kernels, outline
from .timing import FusionTimer

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
            text += " (not measured: the target does not run here and has no rpc device, or tuning.measure is off)"
        if self.measured:
            gain = sum(m["separate_us"] for m in self.measured) / max(sum(m["fused_us"] for m in self.measured), 1e-9)
            text += f" (measured: the kernels they replace take {gain:.2f}x their time)"
        return text


def row_regions(mod: tvm.IRModule, ctx, rules, timer: FusionTimer | None) -> tuple[tvm.IRModule, RowRegions]:
    """Merge each (row reduction, its only reader: a matmul) pair that schedules and pays."""
    out = RowRegions()
    if ctx.target.kind != "cpu":
        out.skipped = "CPU targets only in this version: a GPU row region needs a block-level rule of its own"
        return mod, out
    g = kernel_graph(mod)
    if g is None:
        return mod, out
    out.timed = timer is not None
    return _merge(mod, g, _pairs(g, rules), rules, timer, out)


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
    why, entry = timer.verdict(func, [(g.calls[r].prim, 1.0), (g.calls[c].prim, 1.0)], "row region")
    if not why:
        out.measured.append({"kernel": g.calls[c].name, **entry})
    return why
