"""Register-blocked plans for window kernels (gensor/window.py) and accumulators held in registers
by one-chunk plans (cpu_lower.py): offered only to kernels of few products per output, several
independent accumulators along the output row, lowered to what the unscheduled kernel computes."""
from __future__ import annotations

import tempfile

import numpy as np
import pytest
import tvm_ffi
from tvm import s_tir, te, tirx, topi

from support.kernel_cases import host_target, random_args, run_kernel
from packager.optimize.layout.sites import ConvSite
from packager.optimize.schedule.gensor.cpu import PAD_VARIANTS, GensorCpu
from packager.optimize.schedule.gensor.cpu_lower import lower_cpu
from packager.optimize.schedule.gensor.cpu_model import REG, CpuSpace
from packager.optimize.schedule.gensor.plan import PADS, REDUCE
from packager.optimize.schedule.gensor.walk import State
from packager.optimize.schedule.gensor.window import register_tiles, window_plans
from packager.optimize.schedule.measure.database import TuningDatabase


def _depthwise(c: int, h: int, w: int, k: int = 3, stride: int = 1):
    p = k // 2
    return ConvSite((1, c, h, w), (c, 1, k, k), (stride, stride), (p,) * 4, (1, 1), c, "float32").kernel(16, 16)


def _conv(cin: int, k: int):
    return ConvSite((1, cin, 12, 12), (32, cin, k, k), (1, 1), (k // 2,) * 4, (1, 1), 1, "float32").kernel(16, 16)


def _max_pool(c: int = 32, h: int = 20):
    x = te.placeholder((1, c // 16, h, h, 16), "float32", "x")
    return te.create_prim_func([x, topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max", layout="NCHW16c")])


def _gensor(measure: bool = False) -> GensorCpu:
    return GensorCpu(host_target(), TuningDatabase(tempfile.mkdtemp()), measure, top_k=2)


def _plans(func):
    g = _gensor()
    space = CpuSpace(g.workload(func), g.hw)
    return g, space, window_plans(space)


@pytest.mark.parametrize("make, offered", [(lambda: _depthwise(32, 20, 20), True), (_max_pool, True),
                                           (lambda: _conv(16, 1), True), (lambda: _conv(32, 3), False),
                                           (lambda: _conv(128, 1), False)])
def test_only_kernels_of_few_products_per_output_are_offered_register_blocked_rows(make, offered):
    """A depthwise conv (9 products per output), a max pool and a 1x1 conv from 16 channels are;
    a 3x3 conv over 32 input channels (288) and a 1x1 conv from 128 are left to the walk."""
    _, _, plans = _plans(make())
    assert bool(plans) is offered


def test_register_tiles_cover_the_fma_latency_along_the_row_and_fall_back_to_rows():
    """The widest row tile near `enough` accumulators, then two rows; a prime width leaves rows
    alone; never more than `most` accumulators."""
    assert register_tiles(152, 200, 12, 8) == [(1, 8), (2, 4)]
    assert register_tiles(7, 7, 12, 8) == [(1, 7)]
    assert register_tiles(19, 25, 12, 8) == [(5, 1)]
    for x, y in [(152, 200), (80, 6), (13, 10), (1, 9), (96, 2)]:
        assert all(2 <= r * c <= 12 and x % c == 0 and y % r == 0 for r, c in register_tiles(x, y, 12, 8))


def test_window_plans_tile_the_row_in_registers_with_the_whole_window_in_one_chunk():
    _, space, plans = _plans(_depthwise(64, 20, 24))
    wl = space.wl
    assert plans
    for plan in plans:
        plan.check()
        accumulators = 1
        for d, kind in enumerate(wl.kinds):
            if kind == REDUCE:
                assert plan.tile(d, "L1") == wl.extents[d]            # one chunk: the whole window
            elif d != wl.vector_axis:
                accumulators *= plan.tile(d, "reg")
        assert accumulators >= 4
        assert plan.pad == PADS[2]                    # a depthwise conv over NCHW16c tests bounds in its reads


@pytest.mark.parametrize("make", [lambda: _depthwise(32, 20, 24), lambda: _depthwise(48, 19, 14, 5),
                                  lambda: _depthwise(32, 28, 28, 3, 2), lambda: _depthwise(16, 7, 7),
                                  _max_pool])
def test_window_plans_compute_what_the_kernel_computes(make):
    func = make()
    g, space, plans = _plans(func)
    target = host_target()
    args = random_args(func)
    want = run_kernel(func, target, [a.copy() for a in args])
    assert plans
    for plan in plans:
        got = run_kernel(g.lower(func, plan), target, [a.copy() for a in args])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _loops_shared_with_init(func: tirx.PrimFunc) -> int:
    """Loops around both the accumulators' init block and the reduction's update block."""
    names = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, lambda b: names.append(b.name_hint)), order="post")
    sch = s_tir.Schedule(func)
    init = sch.get_loops(sch.get_sblock(next(n for n in names if n.endswith("_init"))))
    update = sch.get_loops(sch.get_sblock(next(n for n in names if n.endswith("_update"))))
    shared = 0
    for a, b in zip(init, update):
        if not sch.get(a).same_as(sch.get(b)):
            break
        shared += 1
    return shared


def test_a_one_chunk_plan_keeps_one_register_tile_of_accumulators():
    """With the whole reduction in one chunk the init and write-back sit inside the task's
    spatial loops (one register tile at a time); with the reduction in chunks they stay at the
    task (the accumulators must outlive each chunk). Both compute the kernel."""
    func = _depthwise(32, 20, 24)
    g, space, plans = _plans(func)
    one = plans[0]
    rows = list(one.tiles)
    red = next(d for d, k in enumerate(one.kinds) if k == REDUCE and one.extents[d] > 1)
    rows[red] = (one.extents[red], 1, 1)
    chunked = type(one)(one.axes, one.kinds, one.extents, tuple(rows), one.levels, (), one.vector_axis, pad=one.pad)
    target = host_target()
    args = random_args(func)
    want = run_kernel(func, target, [a.copy() for a in args])
    depth = {}
    for name, plan in (("one", one), ("chunked", chunked)):
        sch = s_tir.Schedule(func)
        lower_cpu(sch, g.rules, g.rules.prepare_anchor(sch), plan)
        depth[name] = _loops_shared_with_init(sch.mod["main"])
        np.testing.assert_allclose(run_kernel(sch.mod["main"], target, [a.copy() for a in args]), want,
                                   rtol=1e-5, atol=1e-5)
    assert depth["chunked"] == 1                        # the task's loop
    assert depth["one"] > 1                             # ... and the spatial loops down to the register tile


def test_a_measured_schedule_times_the_window_plans_beside_the_walks():
    g = _gensor(measure=True)
    func = _depthwise(64, 28, 28)
    extra = len(_plans(func)[2])
    _, _, choice = g.schedule(func, "dw")
    assert extra and choice.trials == g.top_k + PAD_VARIANTS + extra + 1


def test_an_untimed_schedule_takes_the_best_estimate_among_the_walks_and_the_window_plans():
    """Without timing (arm64 from here, `measure: false`) the analytical choice ranks both kinds."""
    g = _gensor(measure=False)
    func = _depthwise(64, 28, 28)
    _, space, plans = _plans(func)
    best = min(space.estimate(State(p.tiles, REG)) for p in plans)
    _, _, choice = g.schedule(func, "dw")
    assert choice.estimate_ms <= best * 1e3 * (1 + 1e-9)


def test_the_switch_leaves_the_walks_plans_and_the_rules_only():
    """optimize.passes.window_rows: false -> GensorCpu(windows=False) times what it timed before."""
    g = GensorCpu(host_target(), TuningDatabase(tempfile.mkdtemp()), True, top_k=2, windows=False)
    _, _, choice = g.schedule(_depthwise(64, 28, 28), "dw")
    assert choice.trials == g.top_k + PAD_VARIANTS + 1 and choice.family == "walk"
