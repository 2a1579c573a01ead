"""ETO's reuse for Gensor on CPU: the reuse condition, sketches, the adapted plan, the feature
ranges, the arborescence, and kernels tuned from another's program computing what the
unscheduled kernel computes, with fewer programs timed."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import s_tir, te

from support.kernel_cases import host_target, random_args, run_kernel
from packager.optimize.schedule.gensor.cpu_model import CpuSpace
from packager.optimize.schedule.measure.database import TuningDatabase
from packager.optimize.schedule.gensor.cpu import GensorCpu, schedule_kernels_gensor
from packager.optimize.schedule.hardware import cpu_hardware
from packager.optimize.schedule.gensor.plan import CPU_LEVELS, TilePlan
from packager.optimize.schedule.tuning.reuse import (REUSE_TRIALS, Source, adapt, features, in_ranges, reusable, reuse_order,
                                              sketch_of, tree_order)
from packager.optimize.schedule.rules.cpu import CpuRules
from packager.optimize.schedule.gensor.walk import State
from packager.optimize.schedule.gensor.workload import analyze
from packager.spec import TargetSpec
from packager.targets import resolve


def matmul(n: int, k: int, m: int):
    a = te.placeholder((n, k), name="a")
    b = te.placeholder((k, m), name="b")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="matmul")
    return te.create_prim_func([a, b, c])


def conv(c: int, f: int, hw: int, kernel: int, stride: int = 1):
    x = te.placeholder((1, c, hw, hw), name="x")
    w = te.placeholder((f, c, kernel, kernel), name="w")
    out = (hw - kernel) // stride + 1
    rc, ry, rx = (te.reduce_axis((0, e), name=n) for e, n in ((c, "rc"), (kernel, "ry"), (kernel, "rx")))
    y = te.compute((1, f, out, out), lambda n, ff, yy, xx: te.sum(
        x[n, rc, yy * stride + ry, xx * stride + rx] * w[ff, rc, ry, rx], axis=[rc, ry, rx]), name="conv")
    return te.create_prim_func([x, w, y])


def workload(func, target):
    rules = CpuRules(target)
    sch = s_tir.Schedule(func)
    return analyze(sch, rules.prepare_anchor(sch).block, "k")


@pytest.fixture(scope="module")
def arm():
    return resolve(TargetSpec("arm64", {}, "t"))


def test_reuse_condition_is_loop_by_loop_dominance():
    """ETO's Definition 2, with the paper's bridge example: [1,64,14,14,64,3,3] and
    [1,64,28,28,64,1,1] reuse neither way (14 < 28 but 3 > 1)."""
    assert reusable((1, 64, 28, 28, 64, 3, 3), (1, 128, 28, 28, 256, 3, 3))
    assert reusable((1, 128, 28, 28, 256, 3, 3), (1, 64, 28, 28, 64, 3, 3))
    assert not reusable((1, 64, 14, 14, 64, 3, 3), (1, 64, 28, 28, 64, 1, 1))
    assert not reusable((4, 4), (4, 4, 1))


def test_sketch_is_everything_but_the_extents(arm):
    same = [sketch_of(workload(conv(c, f, hw, 3), arm)) for c, f, hw in ((16, 32, 30), (32, 64, 16))]
    assert same[0] == same[1]
    assert sketch_of(workload(conv(16, 32, 30, 3, stride=2), arm)) != same[0]          # stride changes the access
    assert sketch_of(workload(conv(16, 32, 30, 1), arm)) == same[0]        # 1x1 is 3x3 with ry, rx = 1 (ETO's C2D)
    assert sketch_of(workload(matmul(64, 64, 64), arm)) != same[0]


def test_adapted_plan_keeps_the_micro_kernel_and_is_valid(arm):
    hw = cpu_hardware(arm)
    src_wl, wl = workload(matmul(128, 256, 128), arm), workload(matmul(64, 128, 256), arm)
    src_plan = TilePlan(src_wl.axes, src_wl.kinds, src_wl.extents, ((32, 8, 4), (128, 32, 8), (256, 64, 1)),
                        CPU_LEVELS, (), src_wl.vector_axis)
    space = CpuSpace(wl, hw)
    state = adapt(space, src_plan)
    assert state is not None and space.valid(state)
    tiles = dict(zip(wl.axes, state.tiles))
    assert [t[2] for t in state.tiles] == [4, 8, 1]                  # register tile kept
    assert tiles[wl.axes[2]][1] == 64                                # the L1 reduction chunk kept
    TilePlan(wl.axes, wl.kinds, wl.extents, state.tiles, CPU_LEVELS).check()


def test_a_source_of_the_same_workload_is_taken_as_it_ran(arm):
    """Its own extents: the tiles as timed, even where the model's L1 footprint would refuse them
    (a window plan's whole row, gensor/window.py); other extents are fitted and checked."""
    hw = cpu_hardware(arm)
    wl = workload(matmul(64, 512, 64), arm)
    space = CpuSpace(wl, hw)
    big = TilePlan(wl.axes, wl.kinds, wl.extents, ((64, 64, 4), (64, 64, 8), (512, 512, 1)), CPU_LEVELS, (),
                   wl.vector_axis)
    assert not space.valid(State(big.tiles, 2))
    assert adapt(space, big) == State(big.tiles, 2)
    other = CpuSpace(workload(matmul(64, 256, 64), arm), hw)
    assert adapt(other, big) is None or other.valid(adapt(other, big))


def test_feature_ranges_follow_eto(arm):
    """B in [r1, r2] x the source's tasks and M in [1, r2] x its L1 bytes: the source's own plan
    on the source is in range; on a kernel with half the reduction (r1 = 2, r2 = 1/2), the
    source's task count is in range and four times it is not."""
    hw = cpu_hardware(arm)
    wl = workload(matmul(128, 256, 128), arm)
    space = CpuSpace(wl, hw)
    plan = TilePlan(wl.axes, wl.kinds, wl.extents, ((32, 8, 4), (128, 32, 8), (256, 64, 1)), CPU_LEVELS, (),
                    wl.vector_axis)
    src = Source("src", sketch_of(wl), plan, False, features(space, plan))
    assert in_ranges(space, State(plan.tiles, 2), src)
    half = CpuSpace(workload(matmul(128, 128, 128), arm), hw)
    same_tasks = State(((32, 8, 4), (128, 32, 8), (128, 32, 1)), 2)
    more_tasks = State(((8, 8, 4), (128, 32, 8), (128, 32, 1)), 2)
    assert in_ranges(half, same_tasks, src) and not in_ranges(half, more_tasks, src)


def test_arborescence_roots_only_what_nothing_dominates():
    big, small, other = (1, 64, 28, 28), (1, 32, 14, 14), (1, 128, 7, 7)
    parents = reuse_order({"a": ("s", big), "b": ("s", small), "c": ("s", other), "d": ("t", small)}, 7)
    # a and b reuse each other (one is the root); c is mixed against both (no bridges) and d is
    # another sketch: both from scratch
    assert parents["c"] is None and parents["d"] is None
    assert sorted([parents["a"], parents["b"]], key=str) == [None, "a"] or sorted(
        [parents["a"], parents["b"]], key=str) == [None, "b"]
    order = tree_order(parents)
    child = "a" if parents["a"] else "b"
    assert order.index(parents[child]) < order.index(child)
    known = reuse_order({"a": ("s", big), "b": ("s", small)}, 7, root_cost={"b": 0.0})
    assert known == {"b": None, "a": "b"}                            # the database's kernel is the free root
    outside = reuse_order({"a": ("s", big), "c": ("s", other)}, 7, root_cost={"a": REUSE_TRIALS, "c": REUSE_TRIALS})
    assert outside == {"a": None, "c": None}          # both reuse sources outside the graph: no scratch root


def test_reused_kernels_compute_the_same_with_fewer_programs_timed(tmp_path):
    """Three matmuls of one sketch: one from scratch, the others from its program (REUSE_TRIALS
    timed each, rules only as the reference); every result equals the unscheduled kernel's."""
    target = host_target()
    kernels = {"m1": matmul(128, 128, 128), "m2": matmul(64, 128, 128), "m3": matmul(128, 256, 128)}
    out, report = schedule_kernels_gensor(kernels, target, tmp_path, measure=True, top_k=3, reuse=True)
    tree, reuse = report.details["reuse"]["tree"], report.details["reuse"]
    assert sum(p is None for p in tree.values()) == 1
    assert reuse["scratch"] == [1, 4] and reuse["reused"][0] == 2 and reuse["reused"][1] <= 2 * (REUSE_TRIALS + 1)
    assert "ETO reuse: 1 kernels tuned from scratch" in report.summary
    for name, func in kernels.items():
        args = random_args(func)
        np.testing.assert_allclose(run_kernel(out[name], target, args), run_kernel(func, target, args),
                                   rtol=1e-4, atol=1e-4)
        if tree[name]:
            assert f"reused {tree[name]}" in report.details["kernels"][name]


def test_a_second_model_reuses_the_first_ones_database(tmp_path):
    """Across models: a kernel never seen before is tuned from a database record of its sketch."""
    target = host_target()
    schedule_kernels_gensor({"first": matmul(128, 128, 128)}, target, tmp_path, measure=True, top_k=3, reuse=True)
    g = GensorCpu(target, TuningDatabase(tmp_path), True, 3, reuse=True)
    _, _, choice = g.schedule(matmul(96, 128, 64), "second")
    assert choice.reused_from == "first" and choice.trials <= REUSE_TRIALS + 1
    g_off = GensorCpu(target, TuningDatabase(tmp_path), True, 3, reuse=False)
    _, _, scratch = g_off.schedule(matmul(96, 128, 32), "third")
    assert scratch.reused_from is None and scratch.trials == 4


def matmul_relu(n: int, k: int, m: int):
    """The same anchor workload as matmul(n, k, m), with an epilogue: a different kernel."""
    a = te.placeholder((n, k), name="a")
    b = te.placeholder((k, m), name="b")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="matmul")
    d = te.compute((n, m), lambda i, j: te.max(c[i, j], 0.0), name="relu")
    return te.create_prim_func([a, b, d])


def test_same_workload_reuse_takes_only_an_exact_workload(tmp_path):
    """reuse_same (level 2): a kernel whose exact workload was measured (the layout search's bare
    conv, here a bare matmul) is timed from that program, and still computes what it should;
    a kernel of another shape is tuned from scratch, with no nearest-sketch reuse."""
    target = host_target()
    schedule_kernels_gensor({"bare": matmul(128, 128, 128)}, target, tmp_path, measure=True, top_k=3)
    kernels = {"fused": matmul_relu(128, 128, 128), "other": matmul(96, 128, 64)}
    out, report = schedule_kernels_gensor(kernels, target, tmp_path, measure=True, top_k=3, same=True)
    assert report.details["reuse"]["same"] and not report.details["reuse"]["on"]
    assert report.details["reuse"]["reused"][0] == 1 and report.details["reuse"]["reused"][1] <= REUSE_TRIALS + 1
    assert "reused bare" in report.details["kernels"]["fused"]
    assert "from scratch" in report.details["kernels"]["other"]
    assert "same-workload reuse: 1 kernels from a measured program of their exact workload" in report.summary
    for name, func in kernels.items():
        args = random_args(func)
        np.testing.assert_allclose(run_kernel(out[name], target, args), run_kernel(func, target, args),
                                   rtol=1e-4, atol=1e-4)
