"""The hardware table (targets/table.py): what a CPU row gives LLVM and the runtime, and what a
GPU row gives TVM and the reports."""
from __future__ import annotations

import pytest

from packager.spec import TargetSpec
from packager.targets import ARM_ISA, CUDA_TABLE, X86_ISA, resolve


def test_cpu_rows_give_llvm_an_explicit_cpu_never_native():
    for name in ("x86-avx2", "x86-avx512", "arm64"):
        t = resolve(TargetSpec(name, {}, "t"))
        llvm = t.llvm_target()
        assert llvm["kind"] == "llvm" and llvm["mtriple"] == t.triple and llvm["mcpu"] not in ("", "native")
        assert t.vector_lanes_f32 * 32 == t.vector_bits
        assert t.describe()["cpu_features"] == list(t.features) and t.describe()["kind"] == "cpu"


def test_isa_rows_are_consistent():
    for row in [*X86_ISA.values(), *ARM_ISA.values()]:
        assert row["flops_per_cycle"] == 2 * 2 * row["vector_bits"] // 32      # two FMA pipes x lanes x 2
    assert set(X86_ISA["avx2"]["features"]) < set(X86_ISA["avx512"]["features"])


@pytest.mark.parametrize("name", sorted(CUDA_TABLE))
def test_gpu_rows_carry_the_facts_the_schedules_use(name):
    t = resolve(TargetSpec(name, {}, "g"))
    for fact in ("sms", "max_threads_per_block", "registers_per_sm", "dram_gbs", "fp32_tflops", "warp_size"):
        assert t.facts[fact] > 0, fact
    assert t.tvm_target() == {"kind": "cuda", "arch": t.sm, "max_num_threads": t.facts["max_threads_per_block"],
                              "max_shared_memory_per_block": 48 * 1024}
    assert t.sm_number == int(t.sm.removeprefix("sm_")) and t.describe()["sm"] == t.sm
