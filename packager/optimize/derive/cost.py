"""What a derived program costs (EinNet §6.1), estimated from the hardware table to rank the
search's candidates: every scope at max(flops / compute peak, bytes / DRAM bandwidth). Where the
target runs here the chosen candidate is then timed (timing.py).
"""
from __future__ import annotations

import math

from ..schedule.hardware import Hardware
from .codegen import scopes_in_order, tensors_of
from .expr import Scope
from .match import flops
from .search import Candidate

BYTES = 4                       # float32


def _bytes(s: Scope) -> float:
    return BYTES * (sum(math.prod(src.shape) for src in tensors_of(s)) + math.prod(s.shape))


def roofline_ms(work: float, bytes_: float, hw: Hardware) -> float:
    """max(flops / peak, bytes / DRAM bandwidth) on the whole device, in ms."""
    peak = hw.flops_per_cycle * hw.cores * hw.ghz * 1e9
    return max(work / peak, bytes_ / hw.bytes_per_second("DRAM")) * 1e3


def estimate_ms(program: Scope, hw: Hardware) -> float:
    """Roofline time of every scope, summed."""
    return sum(roofline_ms(flops(s), _bytes(s), hw) for s in scopes_in_order(program))


def rank(candidates: list[Candidate], hw: Hardware) -> list[tuple[float, Candidate]]:
    return sorted(((estimate_ms(c.program, hw), c) for c in candidates), key=lambda x: x[0])
