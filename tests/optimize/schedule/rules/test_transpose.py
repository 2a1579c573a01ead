"""Transposed copies on the CPU: tiled (both axes) when the output's innermost axis reads the
input with a large stride, computing what numpy's transpose computes; other copies keep the flat
schedule."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import s_tir, te, topi

from packager.optimize.schedule.rules.cpu import CpuRules
from packager.optimize.schedule.rules.transpose import read_stride, tile_transposed_copy
from support.kernel_cases import host_target, run_kernel


def _copy(shape, perm=None, reshape=None):
    a = te.placeholder(shape, name="a")
    b = topi.reshape(a, reshape) if reshape else topi.transpose(a, perm)
    return te.create_prim_func([a, b])


def _block(rules, sch):
    return rules._blocks(sch)[-1]


def test_read_stride_is_the_flat_input_step():
    rules = CpuRules(host_target())
    sch = s_tir.Schedule(_copy((1, 64, 56, 56), (0, 2, 3, 1)))     # NCHW -> NHWC
    blk = sch.get(_block(rules, sch))
    assert [read_stride(blk, iv.var) for iv in blk.iter_vars] == [0, 56, 1, 56 * 56]


@pytest.mark.parametrize("shape,perm", [((96, 160), (1, 0)), ((1, 32, 20, 24), (0, 2, 3, 1)),
                                        ((1, 128, 2304), (0, 2, 1))])
def test_transposed_copy_is_tiled_and_exact(shape, perm):
    target = host_target()
    rules = CpuRules(target)
    func = _copy(shape, perm)
    sch = s_tir.Schedule(func)
    assert tile_transposed_copy(sch, _block(rules, sch), rules.lanes(32), 1) is not None
    scheduled, info = rules.schedule(func)
    assert info.rule == "injective" and info.vector >= rules.lanes(32)
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    out = np.zeros([shape[p] for p in perm], "float32")
    np.testing.assert_array_equal(run_kernel(scheduled, target, [x, out]), x.transpose(perm))


@pytest.mark.parametrize("func", [_copy((1, 197, 3, 3, 64), (2, 0, 3, 1, 4)),     # inner axis contiguous
                                  _copy((4, 96, 64), reshape=(4, 6144))],         # a reshape
                         ids=["contiguous-inner", "reshape"])
def test_other_copies_keep_the_flat_schedule(func):
    rules = CpuRules(host_target())
    sch = s_tir.Schedule(func)
    assert tile_transposed_copy(sch, _block(rules, sch), rules.lanes(32), 1) is None
