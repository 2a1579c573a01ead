"""Untimed schedules are checked against their unscheduled loops before they ship (check.py): a
schedule with a wrong tile bound is caught and falls back; one that agrees ships; NaNs where the
reference has NaNs agree; the schedule pass runs the check only when nothing was timed."""
from __future__ import annotations

import pytest
from tvm import te
from tvm.script import tirx as T

from packager.optimize.schedule import cpu as cpu_scheduler
from packager.optimize.schedule.cpu import CpuScheduler
from packager.spec import OptimizeSpec
from packager.optimize.schedule.measure.check import check_untimed, disagreements
from packager.optimize.schedule.rules.cpu import CpuRules
from support.kernel_cases import host_target


def _scale():
    a = te.placeholder((37, 29), name="a")
    b = te.compute((37, 29), lambda i, j: a[i, j] * 3.0, name="b")
    return te.create_prim_func([a, b])


@T.prim_func
def _wrong_tile_bound(a: T.Buffer((37, 29), "float32"), b: T.Buffer((37, 29), "float32")):
    for io in T.parallel(9):                      # 9 tiles of 4 rows: 36, one row short of 37
        for ii in range(4):
            for j in T.vectorized(29):
                b[io * 4 + ii, j] = a[io * 4 + ii, j] * T.float32(3)


def test_a_wrong_tile_bound_falls_back_to_a_schedule_that_agrees():
    ref = _scale()
    rules = CpuRules(host_target())
    out, report = check_untimed({"k": _wrong_tile_bound}, {"k": ref}, {"k": "gensor plan"},
                                lambda name, f: ((g, f"rules: {i.summary()}") for g, i in rules.candidates(f)))
    assert report.checked == 1 and report.fell_back["k"].startswith("gensor plan -> rules: injective")
    assert disagreements({"k": (out["k"], ref)}) == {"k": False}
    assert "1 disagreed and fell back" in report.summary()


def test_a_schedule_that_agrees_ships_and_nans_agree_with_nans():
    a = te.placeholder((64,), name="a")
    b = te.compute((64,), lambda i: te.log(a[i]), name="b")          # NaN for the negative inputs
    ref = te.create_prim_func([a, b])
    sched, _ = CpuRules(host_target()).schedule(ref)
    out, report = check_untimed({"k": sched}, {"k": ref}, {}, lambda name, f: iter(()))
    assert out["k"] is sched and report.checked == 1 and not report.fell_back


def test_nothing_agrees_then_the_unscheduled_loops_ship():
    ref = _scale()
    out, report = check_untimed({"k": _wrong_tile_bound}, {"k": ref}, {}, lambda name, f: iter(()))
    assert out["k"] is ref and report.fell_back["k"] == "schedule -> unscheduled loops"


@pytest.mark.parametrize("measure", [False, True])
def test_the_schedule_pass_checks_only_untimed_choices(monkeypatch, measure):
    from packager.optimize.base import PassReport

    monkeypatch.setattr(cpu_scheduler, "schedule_kernels_gensor", lambda kernels, *a, **k: (
        {"k": _wrong_tile_bound}, PassReport("schedule", "applied", "1 kernels", {"kernels": {"k": "gensor"}})))

    opt = OptimizeSpec(measure=measure, passes={"reuse": False})
    out, report = CpuScheduler(host_target(), opt).schedule_pass({"k": _scale()})
    if measure:
        assert out["k"] is _wrong_tile_bound and "check" not in report.details
    else:
        assert out["k"] is not _wrong_tile_bound and "1 disagreed and fell back (k: gensor -> rules" in report.summary
        assert disagreements({"k": (out["k"], _scale())}) == {"k": False}


def test_a_kernel_with_intrinsics_this_machine_lacks_is_left_unchecked(monkeypatch):
    """A quad int8 kernel (vpdpbusd) checked on a machine without AVX-512 VNNI: LLVM would abort
    the build compiling it for this CPU, so it is reported as not run, never compiled."""
    from packager.optimize.int8 import int_matmul
    from packager.optimize.schedule.measure import check
    from packager.spec import TargetSpec
    from packager.targets import resolve

    a = te.placeholder((1, 8, 64), "uint8", "a")
    panels = te.placeholder((1, 16, 16, 4), "int8", "w")
    ref = te.create_prim_func([a, panels, int_matmul(a, panels)])
    quads, _ = CpuRules(resolve(TargetSpec("x86-avx512-vnni", {}, "test"))).schedule(ref)
    assert "vpdpbusd" in quads.script()
    monkeypatch.setattr(check, "host_cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert disagreements({"k": (quads, ref)}) == {"k": "uses avx512_vnni instructions, which this machine lacks"}
    out, report = check_untimed({"k": quads}, {"k": ref}, {"k": "int-dot"}, lambda name, f: iter(()))
    assert out["k"] is quads and report.checked == 0 and "could not be run here" in report.summary()


def test_an_amx_kernel_is_checked_where_the_tiles_run_and_left_unchecked_elsewhere(monkeypatch):
    """A bf16 tile kernel against its reference loops: checked on a machine with AMX-BF16 (Linux
    grants the tiles), reported as not run on one without."""
    from packager.optimize.schedule.measure import check
    from packager.optimize.schedule.rules import tile_dot
    from packager.spec import TargetSpec
    from packager.targets import resolve

    ref = tile_dot.reference_kernel(tile_dot.TileDot(1, 6, 6, 32, 16, 3, 3, 4, 4))
    spr = resolve(TargetSpec("spr", {"kind": "cpu", "arch": "x86_64", "mcpu": "sapphirerapids"}, "test"))
    tiles, info = CpuRules(spr).schedule(ref)
    assert info.rule == "amx"
    if "amx_bf16" in check.host_cpu_flags():
        assert disagreements({"k": (tiles, ref)}) == {"k": False}
    monkeypatch.setattr(check, "host_cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert disagreements({"k": (tiles, ref)}) == {"k": "uses amx_bf16 instructions, which this machine lacks"}
