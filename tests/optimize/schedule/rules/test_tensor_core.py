"""Tensor cores for fp16 matmuls (rules/tensor_core.py): an fp16 matmul with an fp32 accumulator
is scheduled with wmma fragments; fp32 matmuls, matmuls too small for dlight's tensorization and
kernels that are not matmuls are left to Gensor and the other rules."""
from __future__ import annotations

import tvm
from tvm import te

from packager.optimize.schedule.rules.tensor_core import (_launch_shared, fp16_reduction, tensor_core_matmul,
                                                          uses_tensor_cores)
from packager.optimize.schedule.tir_util import gpu_kernel_fault
from packager.targets import CUDA_TABLE
from packager.targets.table import STATIC_SHARED_BYTES

H100 = tvm.target.Target(CUDA_TABLE["h100"].tvm_target())
ROOM = CUDA_TABLE["h100"].max_shared_bytes


def _matmul(m: int, n: int, k: int, dtype: str, acc: str = "float32") -> tvm.tirx.PrimFunc:
    a = te.placeholder((1, m, k), dtype, name="a")
    b = te.placeholder((k, n), dtype, name="b")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((1, m, n), lambda z, i, j: te.sum(a[z, i, r].astype(acc) * b[r, j].astype(acc), axis=r), name="c")
    return te.create_prim_func([a, b, c])


def test_an_fp16_matmul_runs_on_tensor_cores():
    func = _matmul(128, 256, 192, "float16")
    assert fp16_reduction(func)
    with H100:
        out = tensor_core_matmul(func, H100, STATIC_SHARED_BYTES, ROOM)
    assert out is not None and uses_tensor_cores(out)
    assert gpu_kernel_fault(out, STATIC_SHARED_BYTES) is None
    assert "wmma" in out.script()
    assert 48 * 1024 < _launch_shared(out, H100) <= ROOM        # dlight stages 72 KB


def test_a_gpu_with_less_shared_memory_per_block_keeps_cuda_cores():
    """dlight stages its tiles in 72 KB of dynamic shared memory; a Turing GPU (sm_75) opts in to
    64 KB per block, so the launch would fail there. The kernel stays with Gensor."""
    from packager.targets import resolve
    from packager.spec import TargetSpec

    t4 = resolve(TargetSpec("t4", {"kind": "cuda", "arch": "sm_75"}, "targets[0]"))
    assert t4.max_shared_bytes == 64 * 1024
    target = tvm.target.Target(t4.tvm_target())
    with target:
        assert tensor_core_matmul(_matmul(128, 256, 192, "float16"), target, STATIC_SHARED_BYTES,
                                  t4.max_shared_bytes) is None


def test_fp32_small_and_non_matmul_kernels_are_left_alone():
    with H100:
        assert tensor_core_matmul(_matmul(128, 256, 192, "float32"), H100, STATIC_SHARED_BYTES, ROOM) is None
        assert tensor_core_matmul(_matmul(32, 64, 64, "float16"), H100, STATIC_SHARED_BYTES, ROOM) is None
        x = te.placeholder((4, 256), "float16", name="x")
        r = te.reduce_axis((0, 256), name="r")
        row_sum = te.compute((4,), lambda i: te.sum(x[i, r].astype("float32"), axis=r), name="s")
        func = te.create_prim_func([x, row_sum])
        assert fp16_reduction(func)
        assert tensor_core_matmul(func, H100, STATIC_SHARED_BYTES, ROOM) is None
