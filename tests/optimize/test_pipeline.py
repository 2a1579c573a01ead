"""Graph passes (simplify, fusion) report what they changed; numerical equivalence of every pass
switch is checked end to end in tests/test_build.py::test_each_pass_switch_keeps_results_equal."""
from __future__ import annotations

import pytest

from packager.frontend import bind_profiles, import_relax, load_model, profile_shapes
from packager.codegen.graph import extract_graph
from packager.optimize.relax_util import legalize
from packager.optimize.fusion import fuse
from packager.optimize.pipeline import optimize_graph
from packager.optimize.simplify import simplify
from packager.spec import OptimizeSpec, load_spec


def _cnn(sample_root):
    spec = load_spec(sample_root / "cnn" / "spec.yaml")
    model = load_model(spec.model)
    dtypes = bind_profiles(spec, model)
    return model, import_relax(model, profile_shapes(model, spec.profiles[0]), dtypes)[0]


def test_simplify_folds_every_batchnorm(sample_root):
    _, mod = _cnn(sample_root)
    _, report = simplify(mod)
    assert report.details["batchnorm_folded"] == 4            # the CNN sample has four conv+BN pairs
    assert "4 BatchNorm folded" in report.summary


def test_fusion_merges_elementwise_into_kernels(sample_root):
    _, mod = _cnn(sample_root)
    mod, _ = simplify(mod)
    mod = legalize(mod)
    fused, report = fuse(mod)
    assert report.details["kernels_after"] < report.details["kernels_before"]
    model = load_model(sample_root / "cnn" / "model.onnx")
    g = extract_graph(fused, [i.name for i in model.inputs], [o.name for o in model.outputs])
    assert len(g.calls) == report.details["kernels_after"]
    assert any("conv2d" in c.kernel and "relu" in c.kernel for c in g.calls)   # conv + bias + relu in one kernel


def test_pipeline_reports_passes_that_cannot_run_honestly(sample_root):
    _, mod = _cnn(sample_root)
    _, reports = optimize_graph(mod, OptimizeSpec(level=3))
    status = {r.name: r.status for r in reports}
    assert status["simplify"] == status["fusion"] == "applied"
    assert status["derive"] == "disabled"          # decided per target (timed there): none given here
    assert "tuning" not in status                  # a kernel pass: it runs per target (test below)
    assert status["layout"] == "disabled"          # layouts are chosen per target: none given here
    assert status["reuse"] == "disabled"           # reuse acts where a target's kernels are timed: none here
    assert status["global_fusion"] == "disabled"   # trial-scheduled per target: none given here
    _, reports = optimize_graph(mod, OptimizeSpec(level=2, passes={"fusion": False, "derive": False}))
    status = {r.name: r.status for r in reports}
    assert status["fusion"] == status["derive"] == "disabled"


def test_reuse_says_where_it_can_act(sample_root):
    """Applied for a CPU target timed here; disabled, with the reason, for arm64 from this host
    and for GPU targets, and off with the switch."""
    from packager.optimize.pipeline import PassContext, REUSE, run_passes
    from packager.spec import TargetSpec
    from packager.targets import can_run_here, resolve

    _, mod = _cnn(sample_root)
    line = {}
    for name in ("x86-64", "arm64", "a100"):
        target = resolve(TargetSpec(name, {}, "t"))
        _, (report,) = run_passes(mod, [REUSE], PassContext(target, OptimizeSpec(level=3)))
        line[name] = report
    assert line["x86-64"].status == ("applied" if can_run_here(resolve(TargetSpec("x86-64", {}, "t"))) else "disabled")
    assert line["arm64"].status == "disabled" and "not timed" in line["arm64"].summary
    assert line["a100"].status == "disabled" and "GPU kernels are not timed" in line["a100"].summary
    _, (off,) = run_passes(mod, [REUSE], PassContext(None, OptimizeSpec(level=3, passes={"reuse": False})))
    assert off.status == "disabled" and "from scratch" in off.summary
    assert not OptimizeSpec(level=2).enabled("reuse") and OptimizeSpec(level=3).enabled("reuse")


def test_same_workload_reuse_is_on_from_level_two_and_says_where_it_acts(sample_root):
    from packager.optimize.pipeline import PassContext, REUSE_SAME, run_passes
    from packager.spec import TargetSpec
    from packager.targets import resolve

    _, mod = _cnn(sample_root)
    assert OptimizeSpec(level=2).enabled("reuse_same") and not OptimizeSpec(level=1).enabled("reuse_same")
    arm = resolve(TargetSpec("arm64", {}, "t"))
    _, (report,) = run_passes(mod, [REUSE_SAME], PassContext(arm, OptimizeSpec(level=2)))
    assert report.status == "disabled" and "not timed" in report.summary
    _, (off,) = run_passes(mod, [REUSE_SAME], PassContext(None, OptimizeSpec(level=2, passes={"reuse_same": False})))
    assert off.status == "disabled" and "from scratch" in off.summary


@pytest.mark.parametrize("name, off_says", [("window_rows", "walk plans"), ("pad_inline", "staged or per task"),
                                            ("cold_heavy", "cache condition")])
def test_schedule_options_are_on_from_level_one_on_cpu_targets_and_say_so(sample_root, name, off_says):
    from packager.optimize import pipeline
    from packager.optimize.pipeline import PassContext, run_passes
    from packager.spec import TargetSpec
    from packager.targets import resolve

    _, mod = _cnn(sample_root)
    assert OptimizeSpec(level=1).enabled(name) and not OptimizeSpec(level=0).enabled(name)
    option = getattr(pipeline, name.upper())

    def line(target: str, opt: OptimizeSpec):
        _, (report,) = run_passes(mod, [option], PassContext(resolve(TargetSpec(target, {}, "t")), opt))
        return report

    arm = line("arm64", OptimizeSpec(level=2))                     # untimed: ranked by the cost model
    assert arm.status == ("disabled" if name == "cold_heavy" else "applied"), arm.summary   # nothing timed
    gpu = line("a100", OptimizeSpec(level=2))
    assert gpu.status == "disabled" and "CPU" in gpu.summary
    off = line("x86-64", OptimizeSpec(level=2, passes={name: False}))
    assert off.status == "disabled" and off_says in off.summary


def test_tuning_says_where_it_can_act():
    """The tuner is a kernel pass: off below level 3 with what runs instead; at level 3
    disabled, with the reason, for arm64 from this host, GPU targets and the rule-based scheduler."""
    from packager.optimize.pipeline import PassContext, TUNING, run_passes
    from packager.spec import TargetSpec
    from packager.targets import resolve

    def line(name: str, opt: OptimizeSpec):
        _, (report,) = run_passes({}, [TUNING], PassContext(resolve(TargetSpec(name, {}, "t")), opt))
        return report

    off = line("x86-64", OptimizeSpec(level=2))
    assert off.status == "disabled" and "below level 3" in off.summary
    arm = line("arm64", OptimizeSpec(level=3))
    assert arm.status == "disabled" and "cannot be timed" in arm.summary
    gpu = line("a100", OptimizeSpec(level=2, trials=10))
    assert gpu.status == "disabled" and "GPU kernels are not timed" in gpu.summary
    rules = line("x86-64", OptimizeSpec(level=3, scheduler="rules"))
    assert rules.status == "disabled" and "gensor" in rules.summary
