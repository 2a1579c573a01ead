"""The measured tuner (level 3): mutations stay in the space, the other loop order computes the
same, the budget holds, a tuned program is never slower than level 2's in the run that chose it,
it is recorded beside level 2's choice, and a rebuild replays it without timing anything."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from tvm import s_tir

from support.kernel_cases import host_target, random_args, run_kernel
from packager.optimize.schedule.gensor.cpu_model import CpuSpace
from packager.optimize.schedule.measure.database import TuningDatabase
from packager.optimize.schedule.gensor.cpu import GensorCpu, schedule_kernels_gensor, tuned_key
from packager.optimize.schedule.gensor.cpu_lower import lower_cpu
from packager.optimize.schedule.hardware import cpu_hardware
from packager.optimize.schedule.gensor.plan import ORDERS
from packager.optimize.schedule.tuning.tune import (BATCH, TRIALS_PER_KERNEL, Budget, budget_of, mutate, reuse_cap,
                                              tune_kernels)
from packager.optimize.schedule.gensor.walk import construct
from packager.optimize.schedule.gensor.workload import func_key
from packager.spec import OptimizeSpec
from test_reuse import conv, matmul, workload


def test_mutants_are_valid_plans_of_the_space():
    """Every mutant's tiles divide their parents (plan.check) and both orders occur."""
    target = host_target()
    wl = workload(conv(32, 64, 16, 3), target)
    space = CpuSpace(wl, cpu_hardware(target))
    plan = space.to_plan(construct(space, 1, restarts=2)[0][1])
    rng = np.random.default_rng(0)
    mutants = [mutate(space, plan, rng) for _ in range(300)]
    for m in mutants:
        m.check()
        assert m.extents == plan.extents and m.vector_axis == plan.vector_axis
    assert {m.order for m in mutants} == set(ORDERS)
    assert len({m for m in mutants}) > 50                  # the moves reach many plans


@pytest.mark.parametrize("func", [matmul(64, 96, 128), conv(16, 32, 12, 3)], ids=["matmul", "conv"])
def test_chunks_inner_order_computes_the_same(func):
    target = host_target()
    g = GensorCpu(target, TuningDatabase(None), measure=False, top_k=1)
    space = CpuSpace(g.workload(func), g.hw)
    ranked = construct(space, 3, restarts=2)
    args = random_args(func)
    want = run_kernel(func, target, args)
    for _, st in ranked[:3]:
        for order in ORDERS:
            plan = replace(space.to_plan(st), order=order)
            sch = s_tir.Schedule(func)
            lower_cpu(sch, g.rules, g.rules.prepare_anchor(sch), plan)
            np.testing.assert_allclose(run_kernel(sch.mod["main"], target, args), want, rtol=1e-4, atol=1e-4)


def test_tuner_keeps_the_budget_and_records_beside_level_two(tmp_path):
    target = host_target()
    kernels = {"big": matmul(128, 256, 128), "small": matmul(32, 64, 32)}
    opt = OptimizeSpec(level=3, passes={"reuse": False}, trials=20, database=tmp_path, top_k=2)
    out, report = tune_kernels(kernels, target, opt, log=lambda _m: None)
    assert out is kernels and report.status == "applied"
    d = report.details
    assert d["timed"] == 20 and sum(k["trials"] for k in d["kernels"].values()) == 20
    db = TuningDatabase(tmp_path)
    g = GensorCpu(target, db, True, 2)
    for name, func in kernels.items():
        key = func_key(func, g.target_key)
        level2, tuned = db.get(key, kind="gensor-cpu"), db.get(tuned_key(key), kind="gensor-cpu")
        assert level2 is not None and tuned is not None and "tuned" not in level2
        assert tuned["tuned"] == d["kernels"][name]["trials"]
        assert d["kernels"][name]["tuned_ms"] <= d["kernels"][name]["level2_ms"]   # the bar only falls
    # the heavier kernel gets the first round (the task scheduler weighs kernels by their time)
    assert d["kernels"]["big"]["trials"] >= BATCH

    # level 3 replays the tuned programs (nothing timed), level 2 its own, both compute the same
    again, report2 = tune_kernels(kernels, target, opt, log=lambda _m: None)
    assert report2.details["timed"] == 0 and "0 of 2 Gensor kernels searched" in report2.summary
    l3, rep3 = schedule_kernels_gensor(kernels, target, tmp_path, True, 2, tuned=True)
    l2, _ = schedule_kernels_gensor(kernels, target, tmp_path, True, 2, tuned=False)
    assert "from database" in rep3.details["kernels"]["big"]
    for name, func in kernels.items():
        args = random_args(func)
        want = run_kernel(func, target, args)
        for sched in (l3, l2):
            np.testing.assert_allclose(run_kernel(sched[name], target, args), want, rtol=1e-4, atol=1e-4)


def test_a_weight_heavy_kernel_is_tuned_under_its_flushed_timing(tmp_path):
    """Level 2 times a weight-heavy kernel (a 16-row matmul over 2 MB of weights) flushed and keys
    its record under that condition; the tuner finds that record, searches the kernel timed the
    same way and records its program under the same condition."""
    from packager.optimize.schedule.gensor.cpu import target_key
    from packager.optimize.schedule.hardware import weight_heavy

    target = host_target()
    heavy = matmul(16, 1024, 512)
    g = GensorCpu(target, TuningDatabase(tmp_path), True, 2)
    if not weight_heavy(heavy, g.hw):
        pytest.skip("this machine's L2 makes the matmul light")
    opt = OptimizeSpec(level=3, passes={"reuse": False}, trials=6, database=tmp_path, top_k=2)
    _, report = tune_kernels({"heavy": heavy}, target, opt, log=lambda _m: None)
    assert report.details["kernels"]["heavy"]["trials"] > 0, report.summary
    cold = target_key(replace(target, cold_weights=True), g.hw)
    db = TuningDatabase(tmp_path)
    key = func_key(heavy, cold)
    assert db.get(key, kind="gensor-cpu") is not None and db.get(tuned_key(key), kind="gensor-cpu") is not None
    assert {r["meta"]["target"] for r in db.records.values()} == {cold}


def test_reuse_children_start_from_the_parents_tuned_program(tmp_path):
    """ETO in the tuner: the arborescence over the searched kernels has one root; the others wait
    for their parent, time its tuned program adapted first, and stay within the reuse cap (an
    eighth of a kernel's share)."""
    target = host_target()
    kernels = {"m1": matmul(128, 256, 128), "m2": matmul(64, 256, 128), "m3": matmul(128, 128, 128)}
    opt = OptimizeSpec(level=3, database=tmp_path, top_k=2)
    _, report = tune_kernels(kernels, target, opt, log=lambda _m: None)
    d = report.details["kernels"]
    children = [n for n in d if d[n]["reused_from"]]
    assert len(children) == 2 and "ETO reuse: 1 searched from scratch" in report.summary
    for n in children:
        assert 1 <= d[n]["trials"] <= reuse_cap(TRIALS_PER_KERNEL)
    root = next(n for n in d if not d[n]["reused_from"])
    assert d[root]["trials"] >= TRIALS_PER_KERNEL // 2
    assert report.details["budget"]["trials"] == TRIALS_PER_KERNEL + 2 * (reuse_cap(TRIALS_PER_KERNEL))
    out, _ = schedule_kernels_gensor(kernels, target, tmp_path, True, 2, reuse=True, tuned=True)
    for name, func in kernels.items():
        args = random_args(func)
        np.testing.assert_allclose(run_kernel(out[name], target, args), run_kernel(func, target, args),
                                   rtol=1e-4, atol=1e-4)


def test_budget_in_seconds_and_level_three_default():
    assert budget_of(OptimizeSpec(level=3), 5) == Budget(5 * TRIALS_PER_KERNEL, 0.0)
    assert budget_of(OptimizeSpec(level=3), 1, 4) == Budget(TRIALS_PER_KERNEL + 4 * (reuse_cap(TRIALS_PER_KERNEL)), 0.0)
    assert budget_of(OptimizeSpec(level=2, seconds=30.0), 5) == Budget(0, 30.0)
    b = Budget(0, 1e-9)
    assert not b.left(0, 0.0) and Budget(10, 0).room(7) == 3


def test_a_second_model_starts_from_the_first_ones_tuned_program(tmp_path):
    """Cross-model reuse in the tuner: a kernel with no parent in its model starts from the
    database's nearest tuned program of its sketch, within the reuse cap."""
    target = host_target()
    opt = OptimizeSpec(level=3, database=tmp_path, top_k=2)
    tune_kernels({"first": matmul(128, 256, 128)}, target, opt, log=lambda _m: None)
    _, report = tune_kernels({"second": matmul(96, 256, 64)}, target, opt, log=lambda _m: None)
    k = report.details["kernels"]["second"]
    assert k["reused_from"] == "first" and 1 <= k["trials"] <= reuse_cap(TRIALS_PER_KERNEL)
    assert "1 of another model in the database" in report.summary
    assert report.details["timed"] == k["trials"]


def test_a_parent_that_keeps_gaining_leaves_its_children_their_cap():
    """The scheduling order alone (no timing): a heavy root that gains every round stops at its
    share while its children, under their cap, are ready; the budget then reaches all of them."""
    from packager.optimize.schedule.tuning.tune import Task, Tuner

    class Gaining(Tuner):
        def round(self, t):
            n = min(self.budget.room(self.used), (t.cap - t.trials) if t.cap else BATCH)
            self.used += n
            t.trials += n
            t.best_s *= 0.9                              # always 10% faster: never stale

    share = 4 * BATCH
    root = Task("root", None, "k", None, {}, None, 1.0, 1.0)
    kids = [Task(f"kid{i}", None, f"k{i}", None, {}, None, 0.01, 0.01, parent=root, cap=BATCH) for i in range(2)]
    tuner = Gaining(None, Budget(share + 2 * BATCH, 0.0), lambda _m: None)
    tuner.run([root, *kids], share)
    assert [k.trials for k in kids] == [BATCH, BATCH] and root.trials == share
