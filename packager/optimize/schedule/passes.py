"""The `schedule` pass, one entry per target kind (the backends' kernel pipelines name these).

CPU: Gensor (construction-based, measured when the target runs here) or the rule-based
baseline (`scheduler: rules`). CUDA: Gensor's GPU construction, then dlight's rules; a GPU kernel
needs thread bindings, so with the pass off only the fallback binding runs.
"""
from __future__ import annotations

from dataclasses import replace

from tvm import tirx

from ..base import PassReport
from .check import check_untimed
from .gensor import schedule_kernels_gensor
from .measure import can_measure
from .rules_cpu import CpuRules, schedule_kernels
from .rules_gpu import schedule_kernels_gpu

Kernels = dict[str, tirx.PrimFunc]


def schedule_cpu(kernels: Kernels, ctx) -> tuple[Kernels, PassReport]:
    """Schedules every kernel; when they were chosen without timing, each is also checked
    against its unscheduled loops on this machine (check.py) and a disagreeing one falls back."""
    opt = ctx.opt
    if opt.scheduler == "gensor":
        out, report = schedule_kernels_gensor(kernels, ctx.target, opt.database, opt.measure, opt.top_k,
                                              opt.enabled("reuse"), opt.tunes())
    else:
        out, report = schedule_kernels(kernels, ctx.target)
    if opt.measure and can_measure(ctx.target):
        return out, report                     # every timed candidate was run against a reference
    rules = CpuRules(ctx.target)
    labels = {n: str(v).split(" (")[0] for n, v in report.details.get("kernels", {}).items()}
    fallbacks = (lambda name, func: ((f, f"rules: {info.summary()}") for f, info in rules.candidates(func)
                                     if info.summary() != labels.get(name)))
    out, check = check_untimed(out, kernels, labels, fallbacks)
    return out, replace(report, summary=f"{report.summary}; {check.summary()}",
                        details={**report.details, "check": check.details()})


def schedule_gpu(kernels: Kernels, ctx) -> tuple[Kernels, PassReport]:
    opt = ctx.opt
    return schedule_kernels_gpu(kernels, ctx.target, full=opt.enabled("schedule"),
                                gensor=opt.scheduler == "gensor", database=opt.database)
