"""The scheduling contract: everything the techniques (derive, layout, global fusion, tuning,
reuse) and the schedule pass may ask of a target's scheduler. One implementation per device
kind (cpu.py, cuda.py), found through `registry.scheduler_for`; a pass gets its scheduler from its
context and never asks which kind of device it serves.

A kernel algorithm (a conv lowering, a packed layout) joins as a candidate of an
implementation's `searcher` or `scheduled`; a capability one kind lacks is a line in its `LACKS`
table, which a technique reads to say why it did not run.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, ClassVar, NamedTuple

import tvm_ffi
from tvm import tirx

from ...spec import OptimizeSpec
from ...targets import Target
from .gensor.workload import func_key
from .hardware import Hardware
from .measure.database import TuningDatabase
from .measure.timing import Tally
from .rules.int_dot import TILE as TILE_DOT, IntDot  # noqa: F401
# The bf16 and int8 passes' kernel form (a tagged TileDot kernel of reference loops; each scheduler makes its own)
from .rules.tile_dot import CHUNK as TILE_CHUNK, KINDS as TILE_KINDS, PANEL as TILE_PANEL, TileDot, reference_kernel, \
    tile_channels, tile_height, tile_unfit, tiled_rows  # noqa: F401
# The winograd pass's transform kernels (block annotations its CPU rule schedules by)
from .rules.winograd import ATTR as WINOGRAD_ATTR, TILE as WINOGRAD_TILE, stage as winograd_stage  # noqa: F401


ONLY_GENSOR_REUSES = ("nothing to reuse: only Gensor's measured CPU tuning reuses programs (GPU kernels are not "
                      "timed at build time)")


class Trial(NamedTuple):
    """A kernel as the schedule pass will schedule it: the scheduled PrimFunc (None: nothing
    fits), the rule that took it, and the cost model's estimate (ms; None: not estimated)."""

    func: tirx.PrimFunc | None
    rule: str
    estimate_ms: float | None = None


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


class NotOffered(RuntimeError):
    """A scheduler asked for what its kind does not do (timing where nothing runs at build time,
    a CUDA searcher for the CPU layout search, the tuner where nothing is timed). The passes ask
    `measuring`, `why_not_tuned()` and `lacks()` first and report the reason instead."""


class KernelScheduler(ABC):
    """A target's scheduler, built once per pass run; it counts what timing costs into the
    build's `tally`."""

    kind: ClassVar[str]
    # technique -> why this kind does not do it (a technique that finds itself here reports it)
    LACKS: ClassVar[dict[str, str]] = {}

    def __init__(self, target: Target, opt: OptimizeSpec | None = None, tally: Tally | None = None):
        self.target = target
        self.opt = opt if opt is not None else OptimizeSpec()
        self.tally = tally if tally is not None else Tally()

    def lacks(self, technique: str) -> str | None:
        """Why this kind of device does not run `technique` (None: it does)."""
        return self.LACKS.get(technique)

    @property
    @abstractmethod
    def can_measure(self) -> bool:
        """Whether candidates for this target can be timed during the build."""

    @property
    def measuring(self) -> bool:
        """Candidates are timed: the target can be, and the spec lets builds measure."""
        return self.opt.measure and self.can_measure

    def where_measured(self) -> str:
        return "nowhere (not timed at build time)"

    def database(self) -> TuningDatabase:
        """The spec's tuning database (a fresh handle: each user saves what it adds)."""
        return TuningDatabase(self.opt.database)

    @abstractmethod
    def hardware(self) -> Hardware:
        """The memory hierarchy and compute the cost models use."""

    @abstractmethod
    def target_key(self) -> str:
        """The key under which the database keeps this target's (and this machine's) records."""

    @staticmethod
    def record_key(func: tirx.PrimFunc, prefix: str) -> str:
        """The database key of a kernel's record under `prefix` (its structure, names included)."""
        return func_key(func, prefix)

    @abstractmethod
    def scheduled(self, func: tirx.PrimFunc, threads: int | None = None) -> Trial:
        """`func` as the schedule pass will schedule it (with `threads` threads per block where
        a kernel must keep a block shape)."""

    def rule(self, func: tirx.PrimFunc) -> str:
        """The rule that takes `func` ("none" when nothing fits)."""
        return self.scheduled(func).rule

    def refusal(self, func: tirx.PrimFunc, rule: str) -> str:
        """Why the named rule does not take `func` ("" when there is nothing to say)."""
        return ""

    def time(self, funcs: list[tirx.PrimFunc], warm: bool = False, written_first: bool = False
             ) -> list[float | None]:
        """Seconds per run of each (already scheduled) kernel, timed in alternation; `warm`
        ignores the target's cold-weights setting; `written_first` times each run after its first
        argument was rewritten (as Gensor times a kernel's plans). Only where `can_measure`."""
        raise NotOffered(f"{self.target.name}: kernels are not timed at build time")

    def time_chains(self, chains: list[list[tirx.PrimFunc]]) -> list[float | None]:
        """Seconds per run of each chain of (already scheduled) kernels, each reading the one
        before's output, as the package runs them once per inference: the chain's input just
        written, every kernel's weights out of the caches (measure/chain.py). Only where
        `can_measure`."""
        raise NotOffered(f"{self.target.name}: kernels are not timed at build time")

    def searcher(self, top_k: int, measure: bool = True, reuse: bool = False, db: TuningDatabase | None = None):
        """Gensor's search for this target (`schedule(func, name) -> (func, rule, Choice)`)."""
        raise NotOffered(f"{self.target.name}: {self.kind} targets offer no searcher to the graph passes (their layouts "
                         "are not searched)")

    def with_cold_weights(self, weight_bytes: int) -> Target:
        """The target, marked to time candidates with the caches flushed when the model's
        weights exceed its last-level cache and it is timed (else unchanged)."""
        return self.target

    @abstractmethod
    def schedule_pass(self, kernels: dict[str, tirx.PrimFunc]):
        """The `schedule` kernel pass: (scheduled kernels, PassReport)."""

    def integer_dots(self) -> tuple[IntDot, ...]:
        """The integer dot products this target's kernels take, preferred first (empty: QDQ
        matmuls and convs stay in float)."""
        return ()

    def why_not_tuned(self) -> str | None:
        """Why the measured tuner cannot run (None: it can)."""
        return "this target's kernels are not timed at build time; Gensor's analytical choice stands"

    def tune(self, kernels: dict[str, tirx.PrimFunc], log: Callable[[str], None]):
        """The `tuning` kernel pass, where `why_not_tuned()` is None."""
        raise NotOffered(f"{self.target.name}: {self.why_not_tuned()}")

    def reuse_note(self) -> str | None:
        """Why ETO's reuse cannot act for this target (None: it can)."""
        return self.why_not_tuned()
