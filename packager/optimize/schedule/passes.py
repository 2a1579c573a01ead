"""The `schedule` pass, one entry per target kind (the backends' kernel pipelines name these).

CPU: Gensor (construction-based, measured when the target runs here) or the rule-based
baseline (`scheduler: rules`). CUDA: Gensor's GPU construction, then dlight's rules; a GPU kernel
needs thread bindings, so with the pass off only the fallback binding runs.
"""
from __future__ import annotations

from tvm import tirx

from ..base import PassReport
from .gensor import schedule_kernels_gensor
from .rules_cpu import schedule_kernels
from .rules_gpu import schedule_kernels_gpu

Kernels = dict[str, tirx.PrimFunc]


def schedule_cpu(kernels: Kernels, ctx) -> tuple[Kernels, PassReport]:
    opt = ctx.opt
    if opt.scheduler == "gensor":
        return schedule_kernels_gensor(kernels, ctx.target, opt.database, opt.measure, opt.top_k, opt.enabled("reuse"),
                                       opt.tunes())
    return schedule_kernels(kernels, ctx.target)


def schedule_gpu(kernels: Kernels, ctx) -> tuple[Kernels, PassReport]:
    opt = ctx.opt
    return schedule_kernels_gpu(kernels, ctx.target, full=opt.enabled("schedule"),
                                gensor=opt.scheduler == "gensor", database=opt.database)
