"""The loop order inside a tiled reduction's task (reduction_order.py): a KxK conv's input
channels innermost and unrolled, through the rule-based schedule that applies it."""
from __future__ import annotations

import numpy as np
import pytest
import tvm

from support.kernel_cases import host_target, loops_of, random_args, run_kernel
from packager.optimize.schedule.rules.reduction_order import CONTIGUOUS_UNROLL
from packager.optimize.schedule.rules.cpu import CpuRules


def _packed_conv(k: int):
    """A KxK conv over NCHW8c with an OIHW8i8o weight, as the layout pass writes it."""
    from tvm import te

    from packager.optimize.layout.conv import ConvLayouts, conv2d_packed

    data = te.placeholder((1, 2, 12, 12, 8), name="data")
    weight = te.placeholder((2, 2, k, k, 8, 8), name="w")
    out = conv2d_packed(data, weight, ConvLayouts(8, 8, 8, 8), 16, 16, (1, 1), (k // 2,) * 4, (1, 1), 1, "float32")
    return te.create_prim_func([data, weight, out])


@pytest.mark.parametrize("k", [3, 1])
def test_a_kxk_convs_input_channel_loop_is_innermost_and_unrolled(k):
    """A packed 3x3 conv's reduction runs rco, ry, rx, then the input channels of the block (whose
    broadcasts share a cache line and whose weight rows are contiguous), that loop split by
    CONTIGUOUS_UNROLL and unrolled; a 1x1 conv's channel loop passes only loops of length 1 and
    is not unrolled. Both compute what the unscheduled kernel computes."""
    func = _packed_conv(k)
    target = host_target()
    scheduled, info = CpuRules(target).schedule(func)
    assert info.rule == "tiled-reduction", info
    names = [lp.loop_var.name for lp in loops_of(scheduled.body) if lp.loop_var.name.startswith("r")]
    unrolled = [lp for lp in loops_of(scheduled.body)
                if lp.loop_var.name.startswith("rci") and lp.kind == tvm.tirx.ForKind.UNROLLED]
    if k == 3:
        assert names == ["rco", "ry", "rx", "rci_0", "rci_1"], names
        assert [int(lp.extent) for lp in unrolled] == [CONTIGUOUS_UNROLL]
    else:
        assert names == ["rco", "ry", "rx", "rci"], names          # ry and rx are 1 long: nothing moved
        assert not unrolled
    args = random_args(func)
    ref = run_kernel(func, target, [a.copy() for a in args])
    got = run_kernel(scheduled, target, [a.copy() for a in args])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_gensor_plans_keep_the_order_and_compute_the_same():
    """Gensor's CPU lowering applies the same order to every plan of a packed 3x3 conv: inside a
    reduction chunk the input channels run innermost, split for the unroll where the chunk is a
    multiple of it, and each lowered plan (both chunk orders) computes what the kernel computes."""
    from dataclasses import replace

    from tvm import s_tir

    from packager.optimize.schedule.gensor.cpu_lower import lower_cpu
    from packager.optimize.schedule.gensor.cpu_model import CpuSpace
    from packager.optimize.schedule.measure.database import TuningDatabase
    from packager.optimize.schedule.gensor.cpu import GensorCpu
    from packager.optimize.schedule.gensor.plan import ORDERS
    from packager.optimize.schedule.gensor.walk import construct

    func = _packed_conv(3)
    target = host_target()
    g = GensorCpu(target, TuningDatabase(None), measure=False, top_k=1)
    space = CpuSpace(g.workload(func), g.hw)
    args = random_args(func)
    want = run_kernel(func, target, [a.copy() for a in args])
    plans = [space.to_plan(st) for _, st in construct(space, 3, restarts=2)[:3]]
    d = plans[0].axes.index("v_rci")                 # and one whose chunk holds all 8 input channels
    plans.append(replace(plans[0], tiles=tuple((8, 8, 1) if i == d else t for i, t in enumerate(plans[0].tiles))))
    for base in plans:
        for order in ORDERS:
            plan = replace(base, order=order)
            sch = s_tir.Schedule(func)
            lower_cpu(sch, g.rules, g.rules.prepare_anchor(sch), plan)
            in_chunk = [lp.loop_var.name for lp in loops_of(sch.mod["main"].body)
                        if lp.loop_var.name.split("_")[:2] in (["rco", "1"], ["ry", "1"], ["rx", "1"], ["rci", "1"])]
            assert in_chunk[-1].startswith("rci_1"), in_chunk
            chunk = plan.tile(plan.axes.index("v_rci"), "L1")
            assert (in_chunk[-1] == "rci_1_1") == (chunk > CONTIGUOUS_UNROLL and chunk % CONTIGUOUS_UNROLL == 0), \
                (in_chunk, chunk)
            got = run_kernel(sch.mod["main"], target, [a.copy() for a in args])
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=plan.describe())
