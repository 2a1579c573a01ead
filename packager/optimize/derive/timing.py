"""Timing a derived program against the operator it replaces, on the machine the target's
candidates are timed on: the operator as TVM lowers it (TOPI's compute, what LegalizeOps emits)
and every scope of the derived program as the packager will build it (a GEMM on a constant weight
as the layout pass's matmul at its measured panel width, the rest as generated), each scheduled
by Gensor (top-k + rules, measured), timed in alternation so both see the same machine."""
from __future__ import annotations

import numpy as np
from tvm import relax, te, topi

from ...targets import Target
from ..schedule.database import TuningDatabase
from ..schedule.gensor import GensorCpu
from ..schedule.measure import time_interleaved
import math

from ..layout.matmul import MatmulSite
from ..layout.search import LayoutSearch
from .codegen import Kernel, kernels
from .expr import Scope, Tensor
from .layout import Relaid, gemm_order
from .match import operands


def original_conv_transpose(call: relax.Call):
    a = call.attrs
    x = te.placeholder(tuple(int(d) for d in call.args[0].ty.shape), "float32", "x")
    w = te.placeholder(tuple(int(d) for d in call.args[1].ty.shape), "float32", "w")
    y = topi.nn.conv2d_transpose_nchw(x, w, [int(s) for s in a.strides], [int(p) for p in a.padding], "float32",
                                      [int(p) for p in a.output_padding])
    return te.create_prim_func([x, w, y])


def time_against_original(call: relax.Call, program: Scope, relaid: dict[str, Relaid], target: Target,
                          database) -> tuple[float, float]:
    """(original ms, derived ms: the sum of its kernels)."""
    g = GensorCpu(target, TuningDatabase(database), True, 6)
    search = LayoutSearch(target, database, True)
    funcs = [g.schedule(original_conv_transpose(call), "derive: original")[0]]
    funcs += [g.schedule(as_built(k, relaid, search), f"derive: {k.output}")[0] for k in kernels(program)]
    times = time_interleaved(funcs, target)
    if any(t is None for t in times):
        return float("inf"), float("inf")
    return times[0] * 1e3, float(np.sum(times[1:])) * 1e3


def as_built(k: Kernel, relaid: dict[str, Relaid], search: LayoutSearch):
    """A GEMM on the (re-laid) weight as the layout pass will build it; other scopes as they are."""
    gemm = gemm_order(k.scope)
    if gemm is None or gemm[0]:
        return k.func
    _, b = operands(k.scope)
    if not (isinstance(b.source, Tensor) and (b.source.name == "W" or b.source.name in relaid)):
        return k.func
    ext = k.scope.iters()
    m, n, kk = (math.prod(ext[x].extent for x in names) for names in gemm[1:])
    site = MatmulSite((m, kk), n, "float32")
    return site.kernel(search.decide_matmul(site).nt)
