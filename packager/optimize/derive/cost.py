"""What a derived program costs (EinNet §6.1): estimated from the hardware table to rank the
search's candidates (matmul-class scopes at the compute peak, eOperators at DRAM bandwidth,
each bounded below by the other), then measured on this machine where the target runs here:
every scope compiled as its own kernel, scheduled by Gensor (top-k + rules, measured), and
timed in alternation with the kernel the packager builds today for the same operator.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...targets import Target
from ..schedule.database import TuningDatabase
from ..schedule.gensor import GensorCpu
from ..schedule.hardware import Hardware, cpu_hardware
from ..schedule.measure import time_interleaved
from .codegen import kernels, scopes_in_order, tensors_of
from .expr import Scope
from .match import flops, instantiate
from .search import Candidate

BYTES = 4                       # float32


def _bytes(s: Scope) -> float:
    return BYTES * (sum(math.prod(src.shape) for src in tensors_of(s)) + math.prod(s.shape))


def roofline_ms(work: float, bytes_: float, hw: Hardware) -> float:
    """max(flops / peak, bytes / DRAM bandwidth) on the whole device, in ms."""
    peak = hw.flops_per_cycle * hw.cores * hw.ghz * 1e9
    dram = hw.level("DRAM").bandwidth * hw.cores * hw.ghz * 1e9
    return max(work / peak, bytes_ / dram) * 1e3


def estimate_ms(program: Scope, hw: Hardware) -> float:
    """Roofline time of every scope, summed."""
    return sum(roofline_ms(flops(s), _bytes(s), hw) for s in scopes_in_order(program))


def rank(candidates: list[Candidate], target: Target) -> list[tuple[float, Candidate]]:
    hw = cpu_hardware(target)
    return sorted(((estimate_ms(c.program, hw), c) for c in candidates), key=lambda x: x[0])


@dataclass
class Measured:
    """A derived program's kernels on this machine (ms each) and what each scope is."""

    kernels_ms: list[float]
    kinds: list[str]

    @property
    def total_ms(self) -> float:
        return sum(self.kernels_ms)


def measure(program: Scope, target: Target, database=None, top_k: int = 6) -> Measured:
    """Each scope as a kernel, scheduled by Gensor (measured), then timed in alternation."""
    g = GensorCpu(target, TuningDatabase(database), True, top_k)
    ks = kernels(program)
    funcs = [g.schedule(k.func, f"derived {k.output}")[0] for k in ks]
    times = time_interleaved(funcs, target)
    kinds = {p.scope: p.kind for p in instantiate(program)}
    return Measured([t * 1e3 if t is not None else math.inf for t in times], [kinds.get(k.scope, "?") for k in ks])
