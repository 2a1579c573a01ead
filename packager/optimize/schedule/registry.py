"""The scheduler of each device kind (a target's `kind`): the one place that maps a kind to its
implementation of the scheduling contract, as `codegen.backend` maps it to its backend."""
from __future__ import annotations

from ...spec import OptimizeSpec
from ...targets import Target
from .contract import KernelScheduler
from .cpu import CpuScheduler
from .cuda import CudaScheduler
from .measure.timing import Tally

SCHEDULERS: dict[str, type[KernelScheduler]] = {cls.kind: cls for cls in (CpuScheduler, CudaScheduler)}


def scheduler_for(target: Target, opt: OptimizeSpec | None = None, tally: Tally | None = None) -> KernelScheduler:
    """The scheduler of the target's device kind, for one pass run (or one build's question)."""
    return SCHEDULERS[target.kind](target, opt, tally)
