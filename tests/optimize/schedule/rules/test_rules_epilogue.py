"""The reduction-epilogue rule: a conv whose channels are summed right away by a 1x1 conv, as
one kernel (global fusion's reduction epilogues make them)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from tvm import s_tir

from packager.optimize.globalfuse.epilogue import reduction_epilogues
from packager.optimize.globalfuse.graph import kernel_graph
from packager.optimize.schedule.rules.cpu import CpuRules
from packager.optimize.schedule.tir_util import RuleMismatch
from support.kernel_cases import (conv_then_channel_sum, host_target, optimized_module, random_args, run_kernel,
                                  scheduler)


def _merged(channels: int, out_channels: int):
    target = host_target()
    mod = optimized_module(conv_then_channel_sum(channels, out_channels, 12), target, global_fusion=False)
    sched = scheduler(target)
    out, taken = reduction_epilogues(mod, SimpleNamespace(target=target, scheduler=sched), sched, None)
    assert taken.taken == 1, taken
    # the merged kernel (with 8 lanes a layout conversion of the conv's input stays a kernel too)
    (call,) = [c for c in kernel_graph(out).calls.values() if "epi" in c.name]
    return target, call.prim


@pytest.mark.parametrize("out_channels", [32, 64])    # one block of output channels, two
def test_pixels_are_summed_in_the_parallel_tile_and_the_kernel_computes_the_same(out_channels):
    """Every output channel of a pixel tile is computed inside one parallel iteration (with two
    channel blocks, their loop runs inside it), then summed there; same values as unscheduled."""
    target, func = _merged(16, out_channels)
    scheduled, info = CpuRules(target).schedule(func)
    assert info.rule == "reduction-epilogue", info
    assert info.parallel > 1 and info.vector > 1, info
    args = random_args(func)
    np.testing.assert_allclose(run_kernel(scheduled, target, [a.copy() for a in args]),
                               run_kernel(func, target, [a.copy() for a in args]), rtol=1e-4, atol=1e-4)


def test_the_rule_needs_a_second_reduction_over_the_first_ones_output():
    target = host_target()
    mod = optimized_module(conv_then_channel_sum(16, 32, 12), target, global_fusion=False)
    conv = next(c.prim for c in kernel_graph(mod).calls.values() if "relu" in c.name)
    with pytest.raises(RuleMismatch, match="two reduction blocks"):
        CpuRules(target).reduction_epilogue(s_tir.Schedule(conv))


def _conv_relu_max_pool(rows: int):
    """DNSMOS's pattern as one kernel: 3x3 conv (+ ReLU) whose output a 2x2/2 max pool reads;
    `rows` odd leaves the last row outside every window."""
    from tvm import te, topi

    x = te.placeholder((1, 8, rows, 10), name="x")
    w = te.placeholder((8, 8, 3, 3), name="w")
    y = topi.nn.relu(topi.nn.conv2d_nchw(x, w, 1, 1, 1))
    p = topi.nn.pool2d(y, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), "max", layout="NCHW")
    return te.create_prim_func([x, w, p])


@pytest.mark.parametrize("rows", [9, 10])
def test_a_sliding_pooling_window_is_not_an_epilogue(rows):
    """reverse_compute_at cut the pool's window to one row when 225 conv rows fed 112 windows:
    DNSMOS's untimed build answered wrong in every element. The rule refuses such a tail, and
    whatever rule schedules the kernel instead computes what the loops compute."""
    target = host_target()
    func = _conv_relu_max_pool(rows)
    with pytest.raises(RuleMismatch, match="slides a window"):
        CpuRules(target).reduction_epilogue(s_tir.Schedule(func))
    scheduled, info = CpuRules(target).schedule(func)
    assert info.rule != "reduction-epilogue"
    args = random_args(func)
    np.testing.assert_allclose(run_kernel(scheduled, target, [a.copy() for a in args]),
                               run_kernel(func, target, [a.copy() for a in args]), rtol=1e-4, atol=1e-4)
