"""The rule-based CPU schedule: every kernel computes exactly what TVM's unscheduled kernel computes,
and conv/matmul-like kernels really are parallel + vectorized. Runs kernels in-process with TVM."""
from __future__ import annotations

import numpy as np
import pytest
import tvm

from support.kernel_cases import CASES, host_target, kernels_of, loops_of, random_args, run_kernel
from packager.optimize.schedule.rules.cpu import CpuRules, schedule_kernels
from packager.spec import TargetSpec
from packager.targets import resolve


@pytest.mark.parametrize("name", sorted(CASES))
def test_scheduled_kernels_equal_unscheduled(name):
    target = host_target()
    rules = CpuRules(target)
    for kname, func in kernels_of(CASES[name]).items():
        scheduled, info = rules.schedule(func)
        args = random_args(func)
        ref = run_kernel(func, target, [a.copy() for a in args])
        got = run_kernel(scheduled, target, [a.copy() for a in args])
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=f"{name}/{kname} [{info.summary()}]")
        assert info.rule != "naive", f"{name}/{kname}: no rule applied ({info.note})"


@pytest.mark.parametrize("name", ["conv3x3", "conv3x3_stride2", "matmul_odd", "conv1x1_batch2", "matmul_batched_big"])
def test_conv_and_matmul_are_parallel_and_vectorized(name):
    target = host_target()
    for func in kernels_of(CASES[name]).values():
        _, info = CpuRules(target).schedule(func)
        assert info.rule == "tiled-reduction" and info.vector > 1, info
        assert info.parallel > 1 or name == "matmul_odd", info       # tiny matmul runs on one thread
        if name == "conv3x3_stride2":
            assert "de-interleaved" in info.note


def test_schedules_compile_for_arm64():
    """ARM64 codegen of every rule (running ARM code is covered by `pack verify` under qemu)."""
    arm = resolve(TargetSpec("arm64", {}, "test"))
    kernels = {}
    for name in ("conv3x3", "conv3x3_stride2", "softmax_last", "layernorm", "transpose", "maxpool"):
        for k, f in kernels_of(CASES[name]).items():
            kernels[f"{name}_{k}"] = f
    scheduled, report = schedule_kernels(kernels, arm)
    assert report.details["rules"].get("naive", 0) == 0, report.details
    lib = tvm.tirx.build(tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in scheduled.items()}),
                         target=tvm.target.Target(arm.llvm_target()))
    asm = lib.inspect_source("asm")
    assert "fmla" in asm                          # NEON fused multiply-add in the conv kernels


def test_reduction_split_at_a_folded_reshape_period():
    """An out-projection reading the attention's [heads, rows, d] through transpose + reshape
    indexes k // d and k % d: the rule splits k by d (so the inner loop addresses the operand
    without division) and still computes what the unscheduled kernel computes."""
    from tvm import te

    heads, rows, d, out = 4, 16, 8, 32
    pv = te.placeholder((1, heads, rows, d), name="pv")
    w = te.placeholder((heads * d, out), name="w")
    moved = te.compute((1, rows, heads, d), lambda b, i, h, c: pv[b, h, i, c], name="T_transpose")
    flat = te.compute((1, rows, heads * d), lambda b, i, k: moved[b, i, k // d, k % d], name="T_reshape")
    k = te.reduce_axis((0, heads * d), name="k")
    y = te.compute((1, rows, out), lambda b, i, j: te.sum(flat[b, i, k] * w[k, j], axis=k), name="matmul")
    func = te.create_prim_func([pv, w, y])
    target = host_target()
    scheduled, info = CpuRules(target).schedule(func)
    assert info.rule == "tiled-reduction", info
    reduction = [int(lp.extent) for lp in loops_of(scheduled.body) if lp.loop_var.name.startswith("k_")]
    assert reduction == [heads, d]
    args = random_args(func)
    ref = run_kernel(func, target, [a.copy() for a in args])
    got = run_kernel(scheduled, target, [a.copy() for a in args])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def _concat_scale(planes: int, h: int, w: int):
    """Four channel groups concatenated, times a per-channel constant (a concat + BatchNorm)."""
    from tvm import te, tirx

    xs = [te.placeholder((1, planes, h, w), name=f"x{i}") for i in range(4)]
    s = te.placeholder((1, 4 * planes, 1, 1), name="s")

    def pick(n, c, y, x):
        e = xs[3][n, c - 3 * planes, y, x]
        for i in (2, 1, 0):
            e = tirx.Select(c < (i + 1) * planes, xs[i][n, c - i * planes, y, x], e)
        return e

    y = te.compute((1, 4 * planes, h, w), lambda n, c, yy, xx: pick(n, c, yy, xx) * s[n, c, 0, 0], name="y")
    return te.create_prim_func([*xs, s, y])


def test_awkward_planes_take_a_predicated_tail_where_values_vary_per_channel():
    """7x7 planes (no vector width of half the lanes divides 49) of a concat times per-channel
    constants: whole vectors run over one channel's plane, then a scalar tail loop (vectors
    across channels would gather the constants and every input of the pick; a predicated vector
    loop would run scalar throughout), and the result is exact. A plain copy of the same planes
    still vectorizes across channels (contiguous)."""
    from tvm import te

    target = host_target()
    lanes = CpuRules(target).lanes(32)
    func = _concat_scale(30, 7, 7)
    scheduled, info = CpuRules(target).schedule(func)
    assert info.vector == lanes, info
    vectorized = [lp for lp in loops_of(scheduled.body) if lp.kind == tvm.tirx.ForKind.VECTORIZED]
    assert [int(lp.extent) for lp in vectorized] == [lanes]
    loops = [int(lp.extent) for lp in loops_of(scheduled.body)]
    assert 120 in loops and 49 // lanes in loops and 49 % lanes in loops   # channels outside; vectors, tail
    args = random_args(func)
    np.testing.assert_array_equal(run_kernel(scheduled, target, [a.copy() for a in args]),
                                  run_kernel(func, target, [a.copy() for a in args]))
    x = te.placeholder((1, 120, 7, 7), name="x")
    copy, info = CpuRules(target).schedule(te.create_prim_func([x, te.compute(x.shape, lambda *i: x(*i) * 2.0)]))
    assert 120 not in [int(lp.extent) for lp in loops_of(copy.body)], info


def test_short_rows_are_vectorized_within_a_channel():
    """A uint8 channel shuffle over 28x28 planes (rows of 28, under AVX-512's 64 lanes): the vector
    runs over one channel's plane (its width divides 784), so its loads are contiguous instead of
    gathers across channels; the result is the unscheduled kernel's."""
    from tvm import te

    x = te.placeholder((1, 116, 28, 28), "uint8", "x")
    y = te.compute((1, 116, 28, 28), lambda b, c, h, w: x[b, c % 2 * 58 + c // 2, h, w], name="shuffle")
    func = te.create_prim_func([x, y])
    target = host_target()
    scheduled, info = CpuRules(target).schedule(func)
    assert info.rule == "injective" and 784 % info.vector == 0 and info.vector >= 16, info
    xs = np.random.default_rng(0).integers(0, 256, (1, 116, 28, 28)).astype(np.uint8)
    got = run_kernel(scheduled, target, [xs, np.zeros_like(xs)])
    np.testing.assert_array_equal(got, xs[:, np.arange(116) % 2 * 58 + np.arange(116) // 2])
