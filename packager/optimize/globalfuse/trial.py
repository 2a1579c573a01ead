"""Trial schedules: a proposed fused kernel is only taken when the target's scheduler still
schedules it as well as the kernel it grows (the same rule, never a fallback)."""
from __future__ import annotations

import tvm
from tvm import tirx

from ...targets import Target

WEAK_RULES = {"naive", "fallback", "none"}


def schedule_rule(func: tirx.PrimFunc, target: Target, gensor: bool = True) -> str:
    """The rule the target's scheduler gives `func` ("none" when nothing fits). On the CPU the
    rules decide (Gensor takes only kernels the tiled rule fits); on a GPU Gensor's construction
    comes first, as in the schedule pass."""
    if target.kind == "cuda":
        return _gpu_rule(func, target, gensor)
    from ..schedule.rules_cpu import CpuRules

    return CpuRules(target).schedule(func)[1].rule


def _gpu_rule(func: tirx.PrimFunc, target: Target, gensor: bool) -> str:
    from ...errors import UserError
    from ..schedule.database import TuningDatabase
    from ..schedule.gensor_gpu import GensorGpu
    from ..schedule.rules_gpu import _rules, _schedule_one

    tvm_target = tvm.target.Target(target.tvm_target())
    with tvm_target:
        if gensor and GensorGpu(target, TuningDatabase()).schedule(func) is not None:
            return "gensor"
        try:
            return _schedule_one("trial", func.with_attr("target", tvm_target), tvm_target, _rules())[1]
        except UserError:
            return "none"


def keeps_schedule(before: str, after: str) -> bool:
    """A fusion may not cost the grown kernel its schedule."""
    return after not in WEAK_RULES and (after == before or before in WEAK_RULES)
