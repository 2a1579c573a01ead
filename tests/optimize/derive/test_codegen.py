"""Derived programs compile: every scope becomes a TE kernel that computes what the interpreter
does (padding guards included), and they are ranked by the roofline and timed on this machine."""
from __future__ import annotations

import numpy as np
import tvm

from support.kernel_cases import host_target, scheduler
from packager.optimize.derive.codegen import kernels
from packager.optimize.derive.cost import estimate_ms, rank
from packager.optimize.derive.interp import evaluate
from packager.optimize.derive.operators import conv2d, conv_transpose2d
from packager.optimize.derive.rules import rewrites
from packager.optimize.derive.search import derive
from packager.optimize.derive.timing import measure
from packager.optimize.schedule.hardware import cpu_hardware


def _golden(expr):
    for want in ("R1 split Sum_{c}", "R2 h", "R2 w", "R5", "R5"):
        expr = next(s for n, s in rewrites(expr) if n.startswith(want))
    return expr


def _run(program, inputs):
    values = dict(inputs)
    for k in kernels(program):
        lib = tvm.tirx.build(tvm.IRModule({"main": k.func}), target="llvm")
        args = [tvm.runtime.tensor(values[n]) for n in k.inputs] + [tvm.runtime.tensor(np.zeros(k.scope.shape, "float32"))]
        lib["main"](*args)
        values[k.output] = args[-1].numpy()
    return values["out"]


def test_derived_conv3x3_and_conv_transpose_kernels_compute_the_same():
    rng = np.random.default_rng(0)
    for expr in (conv2d((1, 5, 6, 7), (4, 5, 3, 3), pads=(1, 1, 1, 1)),
                 conv_transpose2d((1, 5, 3, 4), (5, 3, 4, 4), (2, 2), (1, 1, 1, 1))):
        program = _golden(expr)
        inputs = {name: rng.standard_normal(shape).astype("float32")
                  for name, shape in (("X", expr.body.a.source.shape), ("W", expr.body.b.source.shape))}
        assert len(kernels(program)) == 2
        np.testing.assert_allclose(_run(program, inputs), evaluate(expr, inputs), rtol=1e-4, atol=1e-4)


def test_candidates_are_ranked_by_the_roofline_and_measured_here(tmp_path):
    target = host_target()
    expr = conv2d((1, 8, 8, 8), (8, 8, 3, 3), pads=(1, 1, 1, 1))
    ranked = rank(derive(expr, 7, seconds=30).candidates, cpu_hardware(target))
    estimates = [e for e, _ in ranked]
    assert estimates == sorted(estimates) and estimates[0] > 0
    assert estimate_ms(ranked[0][1].program, cpu_hardware(target)) == estimates[0]
    m = measure(ranked[0][1].program, scheduler(target, tmp_path), top_k=2)
    assert sorted(m.kinds) == ["eop", "matmul"] and all(0 < t < 1e3 for t in m.kernels_ms)
