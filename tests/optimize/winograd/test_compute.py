"""Winograd's kernels against a direct 3x3 conv: the two transforms as the CPU rule schedules
them (parallel tiles, channel vectors), the GEMM between them in numpy."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import te

from packager.optimize.schedule.rules import winograd as rule
from packager.optimize.schedule.rules.cpu import CpuRules
from packager.optimize.winograd.compute import Geometry, input_transform, output_transform, weight_transform
from support.kernel_cases import host_target, run_kernel

BLOCK = 16


def _conv(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - 2, wd + 2 * pad - 2
    return sum(np.einsum("kc,nchw->nkhw", w[:, :, i, j], xp[:, :, i:i + oh, j:j + ow])
               for i in range(3) for j in range(3))


def _packed(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // BLOCK, BLOCK, h, w).transpose(0, 1, 3, 4, 2))


@pytest.mark.parametrize("m,n,c,k,h,w,pad", [(4, 1, 16, 32, 10, 9, 1), (2, 1, 16, 16, 7, 7, 1),
                                             (4, 2, 32, 16, 8, 11, 0), (2, 1, 16, 48, 5, 6, 1)])
def test_kernels_compute_the_conv(m, n, c, k, h, w, pad):
    target = host_target()
    rules = CpuRules(target)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((k, c, 3, 3)).astype(np.float32)
    oh, ow = h + 2 * pad - 2, w + 2 * pad - 2
    g = Geometry(n, c, k, h, w, oh, ow, pad, pad, m)
    d = te.placeholder((n, c // BLOCK, h, w, BLOCK), name="d")
    mm = te.placeholder((g.alpha ** 2, g.tiles, k), name="mm")
    (fi, info_in), (fo, info_out) = (rule.cpu(rules, te.create_prim_func(io)) for io in
                                     ([d, input_transform(d, g)], [mm, output_transform(mm, g, BLOCK)]))
    assert (info_in.rule, info_out.rule) == ("winograd-input", "winograd-output")
    assert info_in.parallel == info_out.parallel == g.tiles and info_in.vector == BLOCK
    v = run_kernel(fi, target, [_packed(x), np.zeros(g.gemm_shapes()[0], np.float32)])
    prod = np.einsum("epc,eck->epk", v, weight_transform(wt, m)).astype(np.float32)
    y = run_kernel(fo, target, [prod, np.zeros((n, k // BLOCK, oh, ow, BLOCK), np.float32)])
    ref = _packed(_conv(x, wt, pad))
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_other_kernels_are_not_transforms():
    a = te.placeholder((8, 8), name="a")
    assert rule.stage(te.create_prim_func([a, te.compute((8, 8), lambda i, j: a[i, j] * 2.0)])) is None
