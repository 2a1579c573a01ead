"""The pass pipeline: which passes run (spec switches + level), in what order, and the report.

Graph passes run once on Relax; kernel passes run per target on the fused PrimFuncs.
Techniques that are not implemented yet are reported as such, never as applied.
"""
from __future__ import annotations

import time

import tvm

from ..lowering import legalize
from ..spec import OptimizeSpec
from ..targets import CpuTarget, CudaTarget
from .base import PassReport
from .cpu_schedule import schedule_kernels
from .fastmath import fastmath
from .fusion import fuse
from .gpu_schedule import schedule_kernels_gpu
from .schedule.gensor import schedule_kernels_gensor
from .simplify import simplify

# Passes named in the spec that this version does not implement, and what they will be.
NOT_IMPLEMENTED = {
    "derive": "EinNet derivation-based rewrites",
    "layout": "ALT joint layout + loop optimization",
    "reuse": "ETO schedule reuse across operators",
}


def _timed(fn, *args):
    t0 = time.perf_counter()
    mod, report = fn(*args)
    report.seconds = time.perf_counter() - t0
    return mod, report


def optimize_graph(mod: tvm.IRModule, opt: OptimizeSpec) -> tuple[tvm.IRModule, list[PassReport]]:
    """Relax in -> legalized (and, if enabled, simplified and fused) Relax + PrimFuncs out."""
    reports: list[PassReport] = []
    if opt.enabled("simplify"):
        mod, r = _timed(simplify, mod)
        reports.append(r)
    else:
        reports.append(PassReport("simplify", "disabled", "off in the spec"))
    if opt.enabled("fastmath"):
        mod, r = _timed(fastmath, mod)
        reports.append(r)
    else:
        reports.append(PassReport("fastmath", "disabled", "off in the spec: exact libm exp/erf/tanh"))
    mod = legalize(mod)
    if opt.enabled("fusion"):
        mod, r = _timed(fuse, mod)
        reports.append(r)
    else:
        reports.append(PassReport("fusion", "disabled", "off in the spec: one kernel per graph op"))
    for name, what in NOT_IMPLEMENTED.items():
        if opt.enabled(name):
            reports.append(PassReport(name, "not implemented", f"{what}: not part of this version; skipped"))
    if opt.level >= 3 or opt.trials:
        reports.append(PassReport("tuning", "not implemented",
                                  "measured tuning (level 3 / tuning.trials) is not part of this version; skipped"))
    return mod, reports


def optimize_kernels(kernels: dict, target: CpuTarget | CudaTarget, opt: OptimizeSpec) -> tuple[dict, list[PassReport]]:
    """Per-target kernel passes (PrimFunc in -> PrimFunc out)."""
    if isinstance(target, CudaTarget):
        t0 = time.perf_counter()
        out, report = schedule_kernels_gpu(kernels, target, full=opt.enabled("schedule"),
                                           gensor=opt.scheduler == "gensor", database=opt.database)
        report.seconds = time.perf_counter() - t0
        return out, [report]
    if not opt.enabled("schedule"):
        return kernels, [PassReport("schedule", "disabled", "off in the spec: kernels are TVM's naive loops")]
    t0 = time.perf_counter()
    if opt.scheduler == "gensor":
        out, report = schedule_kernels_gensor(kernels, target, opt.database, opt.measure, opt.top_k)
    else:
        out, report = schedule_kernels(kernels, target)
    report.seconds = time.perf_counter() - t0
    return out, [report]
