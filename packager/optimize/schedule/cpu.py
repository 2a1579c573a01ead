"""The CPU scheduler: Gensor's construction (timed where the target runs: this machine or its
RPC device) over the rule-based schedules, which also decide what a fused kernel may become.
Kernels chosen without timing are checked against their unscheduled loops on this machine."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from tvm import s_tir, tirx

from ..base import PassReport
from .contract import ONLY_GENSOR_REUSES, IntDot, KernelScheduler, StructMemo, Trial
from .gensor.cpu import GensorCpu, schedule_kernels_gensor, target_key
from .hardware import Hardware, cpu_hardware, last_level_cache
from .measure.check import check_untimed
from .measure.database import TuningDatabase
from .measure.chain import time_chains
from .measure.timing import can_measure, time_interleaved, where_measured
from .rules.cpu import CpuRules, schedule_kernels
from .rules.int_dot import integer_dots
from .tuning.tune import can_tune, tune_kernels

Kernels = dict[str, tirx.PrimFunc]


class CpuScheduler(KernelScheduler):
    kind = "cpu"
    LACKS = {
        "grid_phases": "GPU targets only: a CPU kernel's threads meet at the end of its parallel loop",
        # Folding copies into a CPU matmul's operand reads was mostly measured slower than the copies
        # on x86 (zoo attention: 12-140%); where the target cannot be timed it is not guessed.
        "untimed_folds": "not tried: CPU target not timed (not this machine, no rpc device), and on x86 folds "
                         "were mostly measured slower",
    }

    def __init__(self, target, opt=None, tally=None):
        super().__init__(target, opt, tally)
        self.rules = CpuRules(target)
        self.memo = StructMemo()

    @property
    def can_measure(self) -> bool:
        return can_measure(self.target)

    def lacks(self, technique: str) -> str | None:
        if technique == "cold_heavy" and not self.can_measure:
            return "untimed target (not this machine, no rpc device): its kernels are not timed"
        return super().lacks(technique)

    def where_measured(self) -> str:
        return where_measured(self.target)

    def hardware(self) -> Hardware:
        return cpu_hardware(self.target)

    def target_key(self) -> str:
        return target_key(self.target, self.hardware())

    def scheduled(self, func: tirx.PrimFunc, threads: int | None = None) -> Trial:
        """The rules decide what a kernel becomes (Gensor takes only kernels the tiled rule fits);
        scheduled once per kernel structure."""
        made, info = self.memo.get(func, self.rules.schedule)
        return Trial(made, info.rule)

    def integer_dots(self) -> tuple[IntDot, ...]:
        return integer_dots(self.target)

    def refusal(self, func: tirx.PrimFunc, rule: str) -> str:
        """The rule's own objection (its RuleMismatch text), by rule method name."""
        try:
            getattr(CpuRules(self.target), rule)(s_tir.Schedule(func))
        except Exception as e:  # noqa: BLE001 - the rule's refusal or a schedule primitive's error
            lines = str(e).strip().splitlines()
            return lines[-1][:160] if lines else type(e).__name__
        return "another rule came first"

    def time(self, funcs: list[tirx.PrimFunc], warm: bool = False, written_first: bool = False
             ) -> list[float | None]:
        target = replace(self.target, cold_weights=False) if warm else self.target
        return time_interleaved(funcs, target, tally=self.tally, written_first=written_first)

    def time_chains(self, chains: list[list[tirx.PrimFunc]]) -> list[float | None]:
        return time_chains(chains, self.target, tally=self.tally)

    def searcher(self, top_k: int, measure: bool = True, reuse: bool = False,
                 db: TuningDatabase | None = None) -> GensorCpu:
        return GensorCpu(self.target, db if db is not None else self.database(), measure, top_k, reuse,
                         tally=self.tally, windows=self.opt is None or self.opt.enabled("window_rows"),
                         inline_pads=self.opt is None or self.opt.enabled("pad_inline"),
                         cold_heavy=self.opt is None or self.opt.enabled("cold_heavy"))

    def with_cold_weights(self, weight_bytes: int):
        if self.can_measure and weight_bytes > last_level_cache(self.target):
            return replace(self.target, cold_weights=True)
        return self.target

    def schedule_pass(self, kernels: Kernels) -> tuple[Kernels, PassReport]:
        """Schedules every kernel; when they were chosen without timing, each is also checked
        against its unscheduled loops on this machine (check.py) and a disagreeing one falls back."""
        opt = self.opt
        if opt.scheduler == "gensor":
            out, report = schedule_kernels_gensor(kernels, self.target, opt.database, opt.measure, opt.top_k,
                                                  opt.enabled("reuse"), opt.tunes(), tally=self.tally,
                                                  same=opt.enabled("reuse_same"), windows=opt.enabled("window_rows"),
                                                  inline_pads=opt.enabled("pad_inline"),
                                                  cold_heavy=opt.enabled("cold_heavy"))
        else:
            out, report = schedule_kernels(kernels, self.target)
        if self.measuring:
            return out, report                     # every timed candidate was run against a reference
        labels = {n: str(v).split(" (")[0] for n, v in report.details.get("kernels", {}).items()}
        fallbacks = (lambda name, func: ((f, f"rules: {info.summary()}") for f, info in self.rules.candidates(func)
                                         if info.summary() != labels.get(name)))
        out, check = check_untimed(out, kernels, labels, fallbacks)
        return out, replace(report, summary=f"{report.summary}; {check.summary()}",
                            details={**report.details, "check": check.details()})

    def why_not_tuned(self) -> str | None:
        return can_tune(self.target, self.opt)

    def tune(self, kernels: Kernels, log: Callable[[str], None]) -> tuple[Kernels, PassReport]:
        return tune_kernels(kernels, self.target, self.opt, log, tally=self.tally)

    def reuse_note(self) -> str | None:
        if self.opt.scheduler != "gensor":
            return ONLY_GENSOR_REUSES
        if not self.measuring:
            return ("nothing to reuse: the target's kernels are not timed (not this machine, no rpc device, or "
                    "tuning.measure is off)")
        return None
