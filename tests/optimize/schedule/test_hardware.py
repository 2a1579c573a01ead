"""The hardware facts the scheduler reads: which kernels count as weight-heavy (their candidates
are timed with the caches flushed, gensor/cpu.py timing_target)."""
from __future__ import annotations

import pytest
from tvm import te, tirx

from support.kernel_cases import host_target
from packager.optimize.layout.sites import ConvSite
from packager.optimize.schedule.hardware import cpu_hardware, weight_heavy


def _pointwise(cin: int, cout: int, size: int) -> tirx.PrimFunc:
    return ConvSite((1, cin, size, size), (cout, cin, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, "float32").kernel(16, 16)


@pytest.mark.parametrize("cin, cout, size, heavy", [
    (1152, 320, 7, True),      # EfficientNet-B0's 1x1 convs at 7x7: 1.5 MB of weights, 0.3 MB moved
    (192, 1152, 7, True),
    (576, 160, 7, False),      # 0.37 MB of weights: under half a 1 MB L2
    (16, 96, 112, False),      # 6 KB of weights beside 5.6 MB of activations
    (64, 64, 56, False),
])
def test_weight_heavy_kernels_are_those_whose_weights_outweigh_what_they_move(cin, cout, size, heavy):
    hw = cpu_hardware(host_target())
    if hw.level("L2").capacity != 1 << 20:
        pytest.skip("the cases are sized for a 1 MB L2")
    assert weight_heavy(_pointwise(cin, cout, size), hw) is heavy


def test_a_kernel_of_two_arguments_or_a_dynamic_shape_is_not_weight_heavy():
    hw = cpu_hardware(host_target())
    x = te.placeholder((4096, 4096), name="x")
    assert not weight_heavy(te.create_prim_func([x, te.compute(x.shape, lambda i, j: x[i, j] * 2)]), hw)
    n = tirx.Var("n", "int64")
    a, w = te.placeholder((n, 1024), name="a"), te.placeholder((1024, 1024), name="w")
    k = te.reduce_axis((0, 1024), name="k")
    c = te.compute((n, 1024), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k))
    assert not weight_heavy(te.create_prim_func([a, w, c]), hw)
