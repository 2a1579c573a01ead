"""Trial schedules: a proposed fused kernel is only taken when the target's scheduler still
schedules it as well as the kernel it grows (the same rule, never a fallback)."""
from __future__ import annotations

from typing import Callable

import tvm
import tvm_ffi
from tvm import tirx

from ...targets import Target

WEAK_RULES = {"naive", "fallback", "none"}


class StructMemo:
    """Results per kernel structure (a model's layers repeat the same kernels)."""

    def __init__(self):
        self.seen: dict[int, list] = {}

    def get(self, func: tirx.PrimFunc, compute: Callable[[tirx.PrimFunc], object]):
        h = tvm_ffi.structural_hash(func)
        for f, value in self.seen.get(h, []):
            if tvm_ffi.structural_equal(f, func):
                return value
        value = compute(func)
        self.seen.setdefault(h, []).append((func, value))
        return value


class TrialRules:
    """The rule the target's scheduler gives a kernel ("none" when nothing fits). On the CPU the
    rules decide (Gensor takes only kernels the tiled rule fits); on a GPU Gensor's construction
    comes first, as in the schedule pass. The schedulers are built once per pass run."""

    def __init__(self, target: Target, gensor: bool = True, database=None):
        self.target = target
        self.memo = StructMemo()
        self.gpu_memo: dict[tuple, tuple] = {}   # by (TIR text, held threads), as the database keys
        if target.kind == "cuda":
            from ..schedule.database import TuningDatabase
            from ..schedule.gensor_gpu import GensorGpu

            self.tvm_target = tvm.target.Target(target.tvm_target())
            self.gensor_gpu = GensorGpu(target, TuningDatabase(database)) if gensor else None
        else:
            from ..schedule.rules_cpu import CpuRules

            self.cpu_rules = CpuRules(target)

    def rule(self, func: tirx.PrimFunc) -> str:
        if self.target.kind == "cuda":
            return self.gpu_schedule(func)[1]
        return self._cpu_rule(func)

    def gpu_schedule(self, func: tirx.PrimFunc, threads: int | None = None) -> tuple[tirx.PrimFunc | None, str]:
        """The kernel as the GPU schedule pass will schedule it, and the rule (None, "none")."""
        return self.gpu_plan(func, threads)[:2]

    def gpu_plan(self, func: tirx.PrimFunc, threads: int | None = None) -> tuple[tirx.PrimFunc | None, str, float | None]:
        """gpu_schedule and Gensor's estimate (ms; None for dlight's rules), for a phase that must
        run `threads` threads per block as well. Kept by the kernel's text, names included, as the
        tuning database keys Gensor's records (a recorded plan differs between such kernels)."""
        key = (func.script(), threads)
        if key not in self.gpu_memo:
            self.gpu_memo[key] = self._gpu_schedule(func, threads)
        return self.gpu_memo[key]

    def cpu_schedule(self, func: tirx.PrimFunc) -> tirx.PrimFunc:
        """The kernel as the CPU rules schedule it (once per kernel structure, shared with rule())."""
        return self.memo.get(func, self.cpu_rules.schedule)[0]

    def _cpu_rule(self, func: tirx.PrimFunc) -> str:
        return self.memo.get(func, self.cpu_rules.schedule)[1].rule

    def _gpu_schedule(self, func: tirx.PrimFunc, threads: int | None) -> tuple[tirx.PrimFunc | None, str, float | None]:
        from ...errors import UserError
        from ..schedule.phases import gensor_phase
        from ..schedule.rules_gpu import _rules, _schedule_one

        with self.tvm_target:
            made = gensor_phase(self.gensor_gpu, func, threads) if self.gensor_gpu is not None else None
            if made is not None:
                return made[0], "gensor", made[1].estimate_ms
            try:
                return (*_schedule_one("trial", func.with_attr("target", self.tvm_target), self.tvm_target,
                                       _rules()), None)
            except UserError:
                return None, "none", None


def keeps_schedule(before: str, after: str) -> bool:
    """A fusion may not cost the grown kernel its schedule."""
    return after not in WEAK_RULES and (after == before or before in WEAK_RULES)
