"""The scheduling contract (contract.py) and its two implementations (cpu.py, cuda.py): what the
techniques may ask of a target's scheduler, answered per device kind."""
from __future__ import annotations

import pytest
from tvm import te

from packager.codegen.backend import BACKEND_MODULES
from packager.optimize.pipeline import PIPELINES, PassContext
from packager.optimize.schedule.contract import KernelScheduler, NotOffered, Tally
from packager.optimize.schedule.cpu import CpuScheduler
from packager.optimize.schedule.cuda import CudaScheduler
from packager.optimize.schedule.registry import SCHEDULERS, scheduler_for
from packager.optimize.schedule.rules.cpu import CpuRules
from packager.spec import OptimizeSpec, TargetSpec
from packager.targets import resolve
from support.kernel_cases import host_target, scheduler

H100 = resolve(TargetSpec("h100", {}, "g"))
ARM = resolve(TargetSpec("arm64", {}, "a"))


def _matmul(n: int = 64):
    a = te.placeholder((n, n), name="a")
    b = te.placeholder((n, n), name="b")
    k = te.reduce_axis((0, n), name="k")
    return te.create_prim_func([a, b, te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")])


def _add(n: int = 256):
    a = te.placeholder((n,), name="a")
    return te.create_prim_func([a, te.compute((n,), lambda i: a[i] + 1.0, name="b")])


def test_every_device_kind_has_a_scheduler_a_backend_and_a_pipeline():
    assert set(SCHEDULERS) == set(BACKEND_MODULES) == set(PIPELINES)
    assert all(issubclass(cls, KernelScheduler) and cls.kind == kind for kind, cls in SCHEDULERS.items())
    assert isinstance(scheduler_for(host_target()), CpuScheduler) and isinstance(scheduler_for(H100), CudaScheduler)


def test_a_pass_gets_its_targets_scheduler_with_the_builds_tally():
    tally = Tally()
    ctx = PassContext(host_target(), OptimizeSpec(measure=False), tally=tally)
    assert ctx.scheduler is ctx.scheduler and ctx.scheduler.tally is tally and not ctx.scheduler.measuring


def test_cpu_targets_are_timed_where_they_run_gpus_never():
    here, arm, gpu = scheduler(host_target()), scheduler(ARM), scheduler(H100)
    assert here.can_measure and here.measuring and here.where_measured() == "this machine"
    assert not scheduler(host_target(), measure=False).measuring
    assert not arm.can_measure and not gpu.can_measure
    with pytest.raises(NotOffered):
        gpu.time([_add()])
    with pytest.raises(NotOffered, match="offer no searcher"):
        gpu.searcher(3)
    with pytest.raises(NotOffered, match="not timed at build time"):
        gpu.tune({}, print)
    assert "GPU kernels are not timed" in gpu.why_not_tuned() and gpu.reuse_note()
    assert "cannot be timed" in arm.why_not_tuned()


def test_what_each_kind_lacks_is_said_once():
    cpu, gpu = scheduler(host_target()), scheduler(H100)
    assert "GPU targets only" in cpu.lacks("grid_phases") and gpu.lacks("grid_phases") is None
    assert "CPU targets only" in gpu.lacks("row_regions") and cpu.lacks("row_regions") is None
    assert "not tried" in cpu.lacks("untimed_folds") and gpu.lacks("untimed_folds") is None


def test_the_cpu_scheduler_schedules_as_the_rules_do_once_per_structure():
    s = scheduler(host_target(), measure=False)
    f = _matmul()
    trial = s.scheduled(f)
    assert trial.rule == CpuRules(host_target()).schedule(f)[1].rule == s.rule(f)
    assert s.scheduled(_matmul()).func is trial.func                # same structure: scheduled once
    assert s.refusal(_add(), "tiled_reduction") == "needs exactly one reduction block"   # the rule's own words


def test_the_cuda_scheduler_binds_threads_gensor_first_then_dlight():
    s = scheduler(H100)
    trial = s.scheduled(_matmul(128))
    assert trial.rule == "gensor" and trial.estimate_ms > 0 and "threadIdx" in trial.func.script()
    assert s.scheduled(_matmul(128)) is trial                       # kept by its text
    flat = s.scheduled(_add())                                      # no reduction anchor: dlight's rules
    assert flat.rule != "gensor" and flat.estimate_ms is None and "threadIdx" in flat.func.script()
    assert scheduler(H100, scheduler="rules").scheduled(_matmul(128)).rule != "gensor"


def test_cpu_timing_counts_into_the_tally():
    tally = Tally()
    s = scheduler_for(host_target(), OptimizeSpec(), tally)
    times = s.time([s.scheduled(_add()).func] * 2, warm=True)
    assert all(t and t > 0 for t in times) and tally.programs == 2


def test_keys_separate_targets_and_cache_conditions():
    from dataclasses import replace

    host = host_target()
    keys = {scheduler(t).target_key() for t in (host, replace(host, cold_weights=True), ARM, H100)}
    assert len(keys) == 4
    assert scheduler(host).record_key(_add(), "p") == scheduler(host).record_key(_add(), "p") != \
        scheduler(host).record_key(_add(128), "p")
