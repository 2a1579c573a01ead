"""Helpers for the global-fusion tests: the transformer sample through the graph passes, a pass's
report, a Relax module run on this CPU."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from packager.optimize.pipeline import optimize_graph
from packager.spec import OptimizeSpec


def optimized(transformer, target=None, measure=False, database=None, **passes):
    """The sample's graph passes at level 2 (with these pass switches) for `target` (default: the spec's first)."""
    spec, mod, spec_target = transformer
    opt = OptimizeSpec(level=2, passes=passes, measure=measure, database=database)
    return optimize_graph(mod, opt, target or spec_target)


def report_of(reports, name):
    """The report of pass `name`."""
    return next(r for r in reports if r.name == name)


def run_module(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    """`main` of a Relax module (unscheduled kernels) on this CPU."""
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()
