"""The rule-based CPU schedule: every kernel computes exactly what TVM's unscheduled kernel computes,
and conv/matmul-like kernels really are parallel + vectorized. Runs kernels in-process with TVM."""
from __future__ import annotations

import numpy as np
import pytest
import tvm

from support.kernel_cases import CASES, host_target, kernels_of, random_args, run_kernel
from packager.optimize.schedule.rules_cpu import CpuRules, schedule_kernels
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
    for name in ("conv3x3", "conv3x3_stride2", "softmax_last", "transpose", "maxpool"):
        for k, f in kernels_of(CASES[name]).items():
            kernels[f"{name}_{k}"] = f
    scheduled, report = schedule_kernels(kernels, arm)
    assert report.details["rules"].get("naive", 0) == 0, report.details
    lib = tvm.tirx.build(tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in scheduled.items()}),
                         target=tvm.target.Target(arm.llvm_target()))
    asm = lib.inspect_source("asm")
    assert "fmla" in asm                          # NEON fused multiply-add in the conv kernels
