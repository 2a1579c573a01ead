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
from .layout.conv import legalize_conv2d
from .layout.propagate import alter_layouts
from .layout.search import ProfileMemo
from .schedule.gensor import schedule_kernels_gensor
from .simplify import simplify

# Passes named in the spec that this version does not implement, and what they will be.
NOT_IMPLEMENTED = {
    "derive": "EinNet derivation-based rewrites",
    "reuse": "ETO schedule reuse across operators",
}


def _timed(fn, *args):
    t0 = time.perf_counter()
    mod, report = fn(*args)
    report.seconds = time.perf_counter() - t0
    return mod, report


def layout_key(target: CpuTarget | CudaTarget | None, opt: OptimizeSpec) -> str:
    """Targets with the same key share one lowering: layouts are chosen per CPU target."""
    return target.name if opt.enabled("layout") and isinstance(target, CpuTarget) else "nchw"


def optimize_graph(mod: tvm.IRModule, opt: OptimizeSpec, target: CpuTarget | CudaTarget | None = None,
                   layout_memo: ProfileMemo | None = None) -> tuple[tvm.IRModule, list[PassReport]]:
    """Relax in -> legalized (and, if enabled, simplified, re-laid-out and fused) Relax + PrimFuncs
    out. The layout pass needs the target (vector width, scheduler); without one it is skipped.
    `layout_memo` makes every shape profile of a model use the first profile's layouts."""
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
    custom = None
    if opt.enabled("layout") and target is not None:
        mod, r = _timed(lambda m: alter_layouts(m, target, opt.database, opt.measure, memo=layout_memo), mod)
        reports.append(r)
        custom = {"relax.nn.conv2d": legalize_conv2d} if r.details.get("packed") else None
    elif opt.enabled("layout"):
        reports.append(PassReport("layout", "disabled", "no target given (graph passes without a target)"))
    else:
        reports.append(PassReport("layout", "disabled", "off in the spec: ONNX layouts (NCHW) everywhere"))
    mod = legalize(mod, custom)
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
