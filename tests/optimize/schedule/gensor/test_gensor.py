"""Gensor on CPU targets: the paper's formulas, the walk's graph and determinism, and every lowered
plan computing exactly what TVM's unscheduled kernel computes (scaled-down versions of the
paper's Table IV operators included)."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import s_tir

from support.kernel_cases import CASES, case, host_target, kernels_of, random_args, run_kernel, w
from packager.optimize.schedule.rules.cpu import CpuRules
from packager.optimize.schedule.gensor.cpu_lower import lower_cpu
from packager.optimize.schedule.gensor.cpu_model import CpuSpace
from packager.optimize.schedule.measure.database import TuningDatabase
from packager.optimize.schedule.gensor.cpu import GensorCpu, schedule_kernels_gensor
from packager.optimize.schedule.hardware import cpu_hardware
from packager.optimize.schedule.gensor.walk import (State, cache_bias, caching_benefit, construct, keep_probability,
                                             roulette, tiling_benefit, vthread_benefit, walk)
from packager.optimize.schedule.gensor.workload import analyze
from packager.spec import TargetSpec
from packager.targets import resolve

# Scaled-down Table IV operators: conv C1-C3 (stride 2 / 1 / 2), GEMM M1-M3 (square, K = 4, tall),
# GEMV V1-V3 (N = 1000 included), AvgPool P1-P3 (2x2 s2, odd 83x83, 3x3 s2).
PAPER = {
    "C1": case("Conv", {"x": [2, 16, 30, 30]}, {"strides": [2, 2]}, {"w": w(16, 16, 3, 3)}),
    "C2": case("Conv", {"x": [2, 16, 28, 28]}, {"pads": [1] * 4}, {"w": w(16, 16, 3, 3)}),
    "C3": case("Conv", {"x": [1, 16, 58, 58]}, {"strides": [2, 2]}, {"w": w(16, 16, 3, 3)}),
    "M1": case("MatMul", {"a": [128, 128]}, {}, {"b": w(128, 128)}),
    "M2": case("MatMul", {"a": [1024, 4]}, {}, {"b": w(4, 64)}),
    "M3": case("MatMul", {"a": [512, 64]}, {}, {"b": w(64, 256)}),
    "V1": case("MatMul", {"a": [1, 512]}, {}, {"b": w(512, 512)}),
    "V2": case("MatMul", {"a": [1, 512]}, {}, {"b": w(512, 256)}),
    "V3": case("MatMul", {"a": [1, 256]}, {}, {"b": w(256, 1000)}),
    "P1": case("AveragePool", {"x": [2, 8, 48, 48]}, {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "P2": case("AveragePool", {"x": [1, 8, 83, 83]}, {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "P3": case("AveragePool", {"x": [1, 16, 21, 21]}, {"kernel_shape": [3, 3], "strides": [2, 2]}),
}


def test_formulas_match_the_paper():
    assert vthread_benefit(64, 1) == 1 and vthread_benefit(64, 2) == 2 and vthread_benefit(64, 4) == 2
    assert caching_benefit(10, 1, 2, 4, 8) == pytest.approx((10 + 8) / (2 + 2))
    # Eq. 1 as printed: (Q(T)/Q(T')) / (F(T)/F(T')) = Q(T) F(T') / (Q(T') F(T)).
    assert tiling_benefit(100.0, 10.0, 50.0, 20.0) == pytest.approx(4.0)
    assert tiling_benefit(100.0, 10.0, 100.0, 10.0) == pytest.approx(1.0)
    assert tiling_benefit(100.0, 10.0, 0.0, 20.0) == 0.0
    assert cache_bias(0) == pytest.approx(0.5) and cache_bias(10) == pytest.approx(1.5)
    assert cache_bias(20) == pytest.approx(2.5) and cache_bias(200) == pytest.approx(3.0)
    keeps = [keep_probability(t) for t in range(40)]
    assert all(a > b for a, b in zip(keeps, keeps[1:])) and keeps[10] == pytest.approx(0.5)


def test_roulette_frequencies_follow_the_weights():
    rng = np.random.default_rng(0)
    weights = [1.0, 2.0, 0.0, 5.0]
    n = 40000
    counts = np.bincount([roulette(rng, weights) for _ in range(n)], minlength=4)
    expected = np.array(weights) / sum(weights) * n
    assert counts[2] == 0
    chi2 = sum((c - e) ** 2 / e for c, e in zip(counts, expected) if e > 0)
    assert chi2 < 13.8                       # chi-square, 2 degrees of freedom, p = 0.001


def _space(name: str, target=None):
    target = target or host_target()
    func = next(iter(kernels_of(CASES[name] if name in CASES else PAPER[name]).values()))
    rules = CpuRules(target)
    sch = s_tir.Schedule(func)
    anchor = rules.prepare_anchor(sch)
    wl = analyze(sch, anchor.block, name)
    vec = anchor.vec[0].var.name
    wl = replace(wl, vector_axis=wl.axes.index(vec))
    return func, rules, CpuSpace(wl, cpu_hardware(target))


def test_conv_footprint_includes_the_halo():
    _, _, space = _space("C1")                # stride 2, 3x3 kernel
    wl = space.wl
    tile = [1] * len(wl.extents)
    for d, name in enumerate(wl.axes):
        if name.endswith("yy"):
            tile[d] = 4
        if name.endswith("xx"):
            tile[d] = 8
        if name.endswith(("ry", "rx")):
            tile[d] = 3
    x = wl.inputs[0]
    assert x.footprint(tile) == 9 * 17          # (4-1)*2+3 rows x (8-1)*2+3 columns


def test_tile_and_inv_tile_are_inverse_and_invalid_states_score_zero():
    _, _, space = _space("conv3x3")
    s = space.initial()
    for name, d, s2 in space.actions(s):
        if name != "tile":
            continue
        back = [s3 for n3, d3, s3 in space.actions(s2) if n3 == "invtile" and d3 == d]
        assert back == [s]
    huge = State(tuple((e, e, e) if k == "S" else (e, e, 1) for e, k in zip(space.wl.extents, space.wl.kinds)), 2)
    assert not space.valid(huge)               # the whole conv in registers


def test_walk_is_seeded_bounded_and_valid():
    _, _, space = _space("C2")
    a, b = construct(space, seed=7), construct(space, seed=7)
    assert a == b and len(a) > 3
    kept, best = walk(space, seed=1, steps=30)
    assert len(kept) <= 31
    for est, st in a:
        assert space.valid(st) and est > 0 and math.isfinite(est)
        space.to_plan(st).check()


@pytest.mark.parametrize("name", sorted(PAPER) + ["conv3x3", "conv_depthwise", "conv_grouped", "conv_dilated",
                                                  "conv1x1_batch2", "matmul_odd", "matmul_batched_big",
                                                  "gemm_transb", "maxpool", "global_avgpool"])
def test_top_plans_compute_the_same_as_unscheduled(name):
    func, rules, space = _space(name)
    target = host_target()
    args = random_args(func)
    ref = run_kernel(func, target, [a.copy() for a in args])
    for est, st in construct(space, seed=3)[:3]:
        sch = s_tir.Schedule(func)
        plan = space.to_plan(st)
        lower_cpu(sch, rules, rules.prepare_anchor(sch), plan)
        got = run_kernel(sch.mod["main"], target, [a.copy() for a in args])
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=f"{name}: {plan.describe()}")


def test_pass_measures_records_and_reuses(tmp_path):
    target = host_target()
    kernels = {f"{n}_{k}": f for n in ("conv3x3", "matmul_odd", "softmax_last")
               for k, f in kernels_of(CASES[n]).items()}
    out, report = schedule_kernels_gensor(kernels, target, tmp_path, measure=True, top_k=2)
    lines = report.details["kernels"]
    conv = next(v for k, v in lines.items() if k.startswith("conv3x3"))
    assert "measured" in conv and "rules" in conv and "est" in conv, conv
    assert any("row-reduction" in v for v in lines.values())          # softmax keeps its rule
    db = TuningDatabase(tmp_path)
    assert len(db.records) == 2 and all(r["measured"] for r in db.records.values())
    out2, report2 = schedule_kernels_gensor(kernels, target, tmp_path, measure=True, top_k=2)
    assert all("from database" in v for k, v in report2.details["kernels"].items() if not k.startswith("softmax"))
    for name, func in kernels.items():                                  # same choice, same code
        assert tvm_ffi.structural_equal(out[name], out2[name]), name
        args = random_args(func)
        ref = run_kernel(func, target, [a.copy() for a in args])
        np.testing.assert_allclose(run_kernel(out[name], target, [a.copy() for a in args]), ref, rtol=1e-5, atol=1e-5)


def test_past_the_builds_timing_budget_fewer_plans_are_compiled(tmp_path):
    """Once the build's timing budget is spent, a kernel compiles BUDGET_SPENT_TOP_K plans (and
    the rules' schedule) instead of top-k, and its choice is still a correct, timed one."""
    from packager.optimize.schedule.gensor.cpu import BUDGET_SPENT_TOP_K
    from packager.optimize.schedule.measure.timing import Tally

    target = host_target()
    (func,) = kernels_of(CASES["conv3x3"]).values()
    spent = Tally(seconds=100.0, budget_s=1.0)
    _, _, choice = GensorCpu(target, TuningDatabase(tmp_path), measure=True, top_k=6, tally=spent).schedule(func)
    assert choice.trials <= BUDGET_SPENT_TOP_K + 1 and spent.cut == 1
    assert choice.measured_ms is not None or choice.rules_ms is not None


def test_analytical_choice_for_arm64_is_deterministic_and_compiles(tmp_path):
    arm = resolve(TargetSpec("arm64", {}, "test"))
    kernels = {f"{n}_{k}": f for n in ("conv3x3", "conv3x3_stride2", "C3", "M2")
               for k, f in kernels_of(CASES[n] if n in CASES else PAPER[n]).items()}
    a, ra = schedule_kernels_gensor(kernels, arm, tmp_path / "a", measure=True)
    b, _ = schedule_kernels_gensor(kernels, arm, tmp_path / "b", measure=True)
    assert "analytical" in ra.summary and ra.details["rules"].get("gensor") == len(kernels)
    assert all(tvm_ffi.structural_equal(a[n], b[n]) for n in kernels)
    lib = tvm.tirx.build(tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in a.items()}),
                         target=tvm.target.Target(arm.llvm_target()))
    assert "fmla" in lib.inspect_source("asm")


def test_stale_database_record_falls_back_to_rules(tmp_path):
    target = host_target()
    func = next(iter(kernels_of(CASES["conv3x3"]).values()))
    db = TuningDatabase(tmp_path)
    g = GensorCpu(target, db, measure=False, top_k=1)
    g.schedule(func)
    key = next(iter(db.new))
    db.new[key]["plan"]["tiles"][1] = [5, 5, 5]          # does not divide the extent any more
    out, rule, choice = GensorCpu(target, db, measure=False, top_k=1).schedule(func)
    assert choice.source == "rules"
    args = random_args(func)
    np.testing.assert_allclose(run_kernel(out, target, [a.copy() for a in args]),
                               run_kernel(func, target, [a.copy() for a in args]), rtol=1e-5, atol=1e-5)


def _gpu_space(name: str, gpu: str = "a100"):
    from packager.optimize.schedule.gensor.gpu_model import GpuSpace
    from packager.optimize.schedule.hardware import gpu_hardware
    from packager.targets import CUDA_TABLE

    func = next(iter(kernels_of(CASES[name] if name in CASES else PAPER[name]).values()))
    sch = s_tir.Schedule(func)
    anchor = next(b for b in sch.get_child_blocks(sch.get_sblock("root"))
                  if any(iv.iter_type == tvm.tirx.IterVar.CommReduce for iv in sch.get(b).iter_vars))
    return func, GpuSpace(analyze(sch, anchor, name), gpu_hardware(CUDA_TABLE[gpu]))


@pytest.mark.parametrize("name", ["conv3x3", "C1", "M1", "V3", "P2", "matmul_batched_big", "conv_depthwise"])
def test_gpu_walk_respects_the_limits(name):
    _, space = _gpu_space(name)
    ranked = construct(space, seed=5)
    assert ranked == construct(space, seed=5) and ranked
    for est, st in ranked:
        plan = space.to_plan(st)
        plan.check()
        assert space.smem_bytes(st) <= 48 * 1024 and space.threads(st) <= 1024
        assert space.threads(st) >= min(32, space.spatial_points)      # at least a warp per block
        assert all(st.tiles[d][1] % v == 0 for d, v in enumerate(st.vthreads))


def test_gpu_pass_places_conv_and_matmul_with_gensor(tmp_path):
    from packager.codegen.cuda_source import generate_cuda
    from packager.optimize.schedule.rules.gpu import schedule_kernels_gpu
    from packager.targets import CUDA_TABLE

    kernels = {f"{n}_{k}": f for n in ("conv3x3", "C1", "M3", "softmax_last")
               for k, f in kernels_of(CASES[n] if n in CASES else PAPER[n]).items()}
    for gpu in ("v100", "h100"):
        out, report = schedule_kernels_gpu(kernels, CUDA_TABLE[gpu], database=tmp_path)
        chosen = report.details["kernels"]
        assert all(v.startswith("gensor") for k, v in chosen.items() if not k.startswith("softmax")), chosen
        assert not chosen[next(k for k in chosen if k.startswith("softmax"))].startswith("gensor")
        cm = generate_cuda(out, CUDA_TABLE[gpu])
        assert "__shared__" in cm.source
    rules_only, report = schedule_kernels_gpu(kernels, CUDA_TABLE["h100"], gensor=False)
    assert "gensor" not in report.summary.lower() and not any(v.startswith("gensor") for v in report.details["kernels"].values())


def test_kernels_gensor_cannot_tile_keep_the_rules(tmp_path):
    """A 0-d output (1-d x 1-d MatMul) and an empty reduction build as the rule-based pass builds them."""
    target = host_target()
    kernels = {f"{n}_{k}": f for n, m in (("dot", case("MatMul", {"a": [7], "b": [7]})),
                                          ("empty", case("ReduceMax", {"x": [0, 3]}, {"axes": [1], "keepdims": 0})))
               for k, f in kernels_of(m).items()}
    assert {n.split("_")[0] for n in kernels} == {"dot", "empty"}
    out, report = schedule_kernels_gensor(kernels, target, tmp_path, measure=True, top_k=2)
    assert "gensor" not in report.details["rules"]
    for name, func in kernels.items():
        expected, _ = CpuRules(target).schedule(func)
        assert tvm_ffi.structural_equal(out[name], expected), name


@pytest.mark.parametrize("switch", [True, False])
def test_weight_heavy_kernels_are_timed_flushed_and_recorded_apart(tmp_path, monkeypatch, switch):
    """A kernel whose weights outweigh its activations (a 1x1 conv 1152 -> 320 at 7x7) has its
    candidates timed on the cold-weights target (each run after a flush) and its record keyed
    under that condition; a light kernel, or any kernel with `cold_heavy` off, keeps the
    build's warm timing (the target each timing call gets, not the clock)."""
    import packager.optimize.schedule.gensor.cpu as gensor_cpu
    from packager.optimize.layout.sites import ConvSite

    seen = []

    def fake_time(funcs, target, **kw):
        seen.append(getattr(target, "cold_weights", False))
        return [1e-4 * (i + 1) for i in range(len(funcs))]

    monkeypatch.setattr(gensor_cpu, "time_candidates", fake_time)
    heavy = ConvSite((1, 1152, 7, 7), (320, 1152, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, "float32").kernel(16, 16)
    light = ConvSite((1, 64, 14, 14), (64, 64, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, "float32").kernel(16, 16)
    target = host_target()
    g = GensorCpu(target, TuningDatabase(tmp_path), measure=True, top_k=2, cold_heavy=switch)
    if not gensor_cpu.weight_heavy(heavy, g.hw):
        pytest.skip("this machine's L2 makes the conv light")
    g.schedule(heavy, "heavy")
    g.schedule(light, "light")
    assert seen == [switch, False] and g.cold_kernels == int(switch)
    keyed = {r.get("kernel"): r["meta"]["target"] for r in g.db.new.values()}
    cold_key = gensor_cpu.target_key(replace(target, cold_weights=True), g.hw)
    assert (keyed["heavy"] == cold_key) is switch and keyed["light"] == g.target_key != cold_key
