"""Progress of long work (kernels scheduled and measured, layout candidates, derive sites,
conformance cases): live bars (rich) when stdout is a terminal, a plain line per quarter
otherwise, nothing when a library caller set nothing up.

Work deep in a pass asks for the current reporter instead of taking it as a parameter:

    with progress.task("schedule x86-64", len(kernels), "kernels") as t:
        for ...: ...; t.advance()
"""
from __future__ import annotations

import contextlib
import sys
import time
from contextvars import ContextVar
from typing import Callable, Iterator


class Task:
    """One counted piece of work; advance() per item, closed by its `with`."""

    def __init__(self, what: str, total: int, unit: str):
        self.what, self.total, self.unit, self.done = what, total, unit, 0
        self.t0 = time.perf_counter()

    def advance(self, n: int = 1) -> None:
        self.done += n

    def __enter__(self) -> "Task":
        return self

    def __exit__(self, *exc) -> None:
        pass


class Reporter:
    """No output (the default outside the command line)."""

    def task(self, what: str, total: int, unit: str = "items") -> Task:
        return Task(what, total, unit)

    def close(self) -> None:
        pass


class _PlainTask(Task):
    def __init__(self, what: str, total: int, unit: str, log: Callable[[str], None]):
        super().__init__(what, total, unit)
        self.log, self.next_quarter = log, 1

    def advance(self, n: int = 1) -> None:
        super().advance(n)
        if self.total >= 8 and self.done < self.total and self.done * 4 >= self.next_quarter * self.total:
            self.next_quarter = self.done * 4 // self.total + 1
            self.log(f"  {self.what}: {self.done}/{self.total} {self.unit} ({time.perf_counter() - self.t0:.1f} s)")

    def __exit__(self, *exc) -> None:
        if self.total and exc[0] is None:
            self.log(f"  {self.what}: {self.done}/{self.total} {self.unit} done "
                     f"({time.perf_counter() - self.t0:.1f} s)")


class Plain(Reporter):
    """Lines for logs and pipes: a task says how far it is at each quarter and when done."""

    def __init__(self, log: Callable[[str], None] = print):
        self.log = log

    def task(self, what: str, total: int, unit: str = "items") -> Task:
        return _PlainTask(what, total, unit, self.log)


class _LiveTask(Task):
    def __init__(self, what: str, total: int, unit: str, bars):
        super().__init__(what, total, unit)
        self.bars = bars
        self.id = bars.add_task(what, total=total, unit=unit)

    def advance(self, n: int = 1) -> None:
        super().advance(n)
        self.bars.advance(self.id, n)

    def __exit__(self, *exc) -> None:
        self.bars.update(self.id, completed=self.done)
        self.bars.stop_task(self.id)


class Live(Reporter):
    """rich progress bars on the terminal; lines printed meanwhile appear above them."""

    def __init__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bars = Progress(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[unit]}"), TimeElapsedColumn(), transient=False)
        self.bars.start()

    def task(self, what: str, total: int, unit: str = "items") -> Task:
        return _LiveTask(what, total, unit, self.bars)

    def close(self) -> None:
        self.bars.stop()


_CURRENT: ContextVar[Reporter] = ContextVar("progress", default=Reporter())


def task(what: str, total: int, unit: str = "items") -> Task:
    """A task on the current reporter."""
    return _CURRENT.get().task(what, total, unit)


@contextlib.contextmanager
def reporting(log: Callable[[str], None] = print, live: bool | None = None) -> Iterator[Reporter]:
    """Progress for the block: live bars if stdout is a terminal (or `live`), else plain lines."""
    live = sys.stdout.isatty() if live is None else live
    reporter = Live() if live else Plain(log)
    token = _CURRENT.set(reporter)
    try:
        yield reporter
    finally:
        _CURRENT.reset(token)
        reporter.close()
