"""The level-3 tuner's progress: a live bar on a terminal, a line per tenth of the budget in a log."""
from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .tune import Budget, Task


class Progress:
    """Where the budget stands: a live bar when the log goes to a terminal (a log function marks
    that with `live_progress = True`, as the CLI's does), a line per tenth of the budget otherwise."""

    def __init__(self, log: Callable[[str], None], budget: Budget, kernels: int):
        self.log, self.budget, self.t0, self.next = log, budget, time.perf_counter(), 0.1
        self.bar = None
        if getattr(log, "live_progress", False) and sys.stdout.isatty():
            from rich.progress import Progress as Bar
            self.bar = Bar(transient=True)
            self.bar.start()
            self.row = self.bar.add_task(f"tuning {kernels} kernels", total=1.0)

    def update(self, used: int, t: Task) -> None:
        spent = self._fraction(used)
        if self.bar is not None:
            self.bar.update(self.row, completed=spent, description=f"tuning: {used} programs timed; "
                            f"{t.name} {t.best_s * 1e3:.3f} ms")
        elif spent >= self.next:
            self.next = math.floor(spent * 10 + 1) / 10
            self.log(f"    tuning: {used} programs timed, {time.perf_counter() - self.t0:.0f} s "
                     f"({spent:.0%} of {self.budget.describe()}); {t.name} {t.best_s * 1e3:.3f} ms")

    def _fraction(self, used: int) -> float:
        parts = ([used / self.budget.trials] if self.budget.trials else []) + (
            [(time.perf_counter() - self.t0) / self.budget.seconds] if self.budget.seconds else [])
        return min(max(parts or [0.0]), 1.0)

    def done(self) -> None:
        if self.bar is not None:
            self.bar.stop()
