"""Derived programs compile: every scope becomes a TE kernel that computes what the interpreter
does (padding guards included), and they are ranked by the roofline and timed on this machine."""
from __future__ import annotations

import numpy as np
import tvm

from support.kernel_cases import host_target, scheduler
from packager.optimize.derive.codegen import kernels
from packager.optimize.derive.cost import estimate_ms, rank
from packager.optimize.derive.expr import Index, Iter, Tensor, read, scope
from packager.optimize.derive.interp import evaluate
from packager.optimize.derive.match import flops
from packager.optimize.derive.operators import conv2d, conv_transpose2d
from packager.optimize.derive.rules import rewrites
from packager.optimize.derive.search import derive
from packager.optimize.derive.timing import measure
from packager.optimize.derive.window import windows
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


def test_selective_reduces_run_over_their_window_only():
    """A ConvTranspose with kernel = stride: each output point has one non-zero term of the
    40-long sums over input rows and columns; the kernels loop over that one term and still
    compute what the interpreter's full sums do (strides 2 and 3, kernels 2 to 5, both signs)."""
    rng = np.random.default_rng(2)
    big = conv_transpose2d((1, 4, 40, 40), (4, 4, 2, 2), (2, 2), (0, 0, 0, 0))
    assert flops(big) == 2 * 4 * 4 * 80 * 80         # the original: one input pixel per output pixel
    assert windows(big)["i"].taps == 1 and windows(_golden(big))["i"].taps == 1
    for data, weight, strides, pads in (((1, 3, 4, 5), (3, 2, 2, 2), (2, 2), (0, 0, 0, 0)),
                                        ((1, 2, 3, 4), (2, 3, 5, 3), (3, 2), (1, 2, 0, 1))):
        expr = conv_transpose2d(data, weight, strides, pads)
        inputs = {"X": rng.standard_normal(data).astype("float32"), "W": rng.standard_normal(weight).astype("float32")}
        want = evaluate(expr, inputs)
        np.testing.assert_allclose(_run(expr, inputs), want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(_run(_golden(expr), inputs), want, rtol=1e-4, atol=1e-4)
    x = Tensor("X", (3,))                             # a read at 2*i - h + 1: the window's other sign
    expr = scope([Iter("h", 0, 8)], [Iter("i", -1, 9)], read(x, Index.of("i") * 2 - "h" + 1))
    assert windows(expr)["i"].taps == 2
    inputs = {"X": rng.standard_normal(3).astype("float32")}
    np.testing.assert_allclose(_run(expr, inputs), evaluate(expr, inputs), rtol=1e-5, atol=1e-5)
