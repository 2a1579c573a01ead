"""Tensor cores for fp16 matmuls (rules/tensor_core.py, rules/wmma.py): an fp16 matmul with an fp32
accumulator is scheduled with wmma fragments in a block tile sized to it; fp32 matmuls, matmuls
below one fragment and kernels that are not matmuls are left to Gensor and the other rules."""
from __future__ import annotations

import tvm
from tvm import te
from tvm.script import tirx as T

import pytest

from packager.optimize.schedule.rules.tensor_core import (_launch_shared, fp16_reduction, load_intrinsics,
                                                          tensor_core_matmul, uses_tensor_cores)
from packager.optimize.schedule.rules.wmma import WmmaTile, matmul_extents, tiles, wmma_schedule
from packager.optimize.schedule.tir_util import gpu_kernel_fault
from packager.targets import CUDA_TABLE
from packager.targets.table import STATIC_SHARED_BYTES

H100 = tvm.target.Target(CUDA_TABLE["h100"].tvm_target())
ROOM = CUDA_TABLE["h100"].max_shared_bytes
SMS = CUDA_TABLE["h100"].sm_count


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
        out, tile = tensor_core_matmul(func, H100, STATIC_SHARED_BYTES, ROOM, SMS)
    assert uses_tensor_cores(out)
    assert gpu_kernel_fault(out, STATIC_SHARED_BYTES) is None
    assert "wmma" in out.script()
    assert 0 < _launch_shared(out, H100) <= ROOM
    assert tile == tiles(1, 128, 256, 192, SMS, ROOM)[0]


def test_the_tile_spreads_a_batch_one_matmul_and_keeps_reuse_on_a_large_one():
    """dlight's one 128x128 tile ran bert_mini's 128x128x512 feed-forward matmul as one block on
    one of 132 SMs. A small matmul is spread over many SMs; a large one keeps big tiles."""
    small = tiles(1, 128, 128, 512, SMS, ROOM)[0]
    assert small.blocks(1, 128, 128) >= 32
    large = tiles(1, 4096, 4096, 4096, SMS, ROOM)[0]
    assert large.rows * large.cols >= 64 * 64 and large.blocks(1, 4096, 4096) >= SMS
    assert all(t.dynamic_bytes() <= 64 * 1024 for t in tiles(1, 4096, 4096, 4096, SMS, 64 * 1024))


@pytest.mark.parametrize("tile", [WmmaTile(1, 1, 1, 1, 4), WmmaTile(2, 2, 1, 1, 2), WmmaTile(4, 1, 2, 1, 4),
                                  WmmaTile(1, 2, 1, 4, 4), WmmaTile(2, 4, 2, 2, 4)])
def test_every_kind_of_tile_lowers_to_cuda(tile):
    """Unit loops (one warp, one fragment per warp) and a 32-wide K stage lower; the accumulator's
    fp32 staging in dynamic shared memory had failed TVM's merge with the fp16 operand stages."""
    load_intrinsics()
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group

    group = get_wmma_intrin_group(load_scope="shared.dyn", store_scope="shared", in_dtype="float16",
                                  out_dtype="float32", trans_b=True)
    with H100:
        sch = wmma_schedule(_matmul(96, 160, 64, "float16").with_attr("target", H100), tile, group)
    assert sch is not None and uses_tensor_cores(sch.mod["main"])
    assert 0 < _launch_shared(sch.mod["main"], H100) <= tile.dynamic_bytes()


def test_a_gpu_with_less_shared_memory_per_block_gets_a_tile_that_fits():
    """A Turing GPU (sm_75) opts in to 64 KB of shared memory per block: the tile fits it (dlight's
    72 KB stage had left such GPUs on CUDA cores)."""
    from packager.targets import resolve
    from packager.spec import TargetSpec

    t4 = resolve(TargetSpec("t4", {"kind": "cuda", "arch": "sm_75"}, "targets[0]"))
    assert t4.max_shared_bytes == 64 * 1024
    target = tvm.target.Target(t4.tvm_target())
    with target:
        out, tile = tensor_core_matmul(_matmul(128, 256, 192, "float16"), target, STATIC_SHARED_BYTES,
                                       t4.max_shared_bytes, t4.sm_count)
    assert _launch_shared(out, target) <= t4.max_shared_bytes and tile.dynamic_bytes() <= t4.max_shared_bytes


def test_fp32_small_and_non_matmul_kernels_are_left_alone():
    with H100:
        assert tensor_core_matmul(_matmul(128, 256, 192, "float32"), H100, STATIC_SHARED_BYTES, ROOM, SMS) is None
        assert tensor_core_matmul(_matmul(8, 64, 64, "float16"), H100, STATIC_SHARED_BYTES, ROOM, SMS) is None
        assert tensor_core_matmul(_matmul(32, 64, 16, "float16"), H100, STATIC_SHARED_BYTES, ROOM, SMS) is None
        x = te.placeholder((4, 256), "float16", name="x")
        r = te.reduce_axis((0, 256), name="r")
        row_sum = te.compute((4,), lambda i: te.sum(x[i, r].astype("float32"), axis=r), name="s")
        func = te.create_prim_func([x, row_sum])
        assert fp16_reduction(func)
        assert tensor_core_matmul(func, H100, STATIC_SHARED_BYTES, ROOM, SMS) is None


@T.prim_func(s_tir=True)
def _split_then_matmul(x: T.Buffer((128, 128), "float16"), w: T.Buffer((64, 96), "float16"),
                       y: T.Buffer((128, 96), "float32")):
    # what global fusion makes of a split folded into the matmul reading one half: the
    # other half's block stays, read by nothing
    lo = T.sblock_alloc_buffer((128, 64), "float16")
    hi = T.sblock_alloc_buffer((128, 64), "float16")
    for i, j in T.grid(128, 64):
        with T.sblock("split_lo"):
            vi, vj = T.axis.remap("SS", [i, j])
            lo[vi, vj] = x[vi, vj]
    for i, j in T.grid(128, 64):
        with T.sblock("split_hi"):
            vi, vj = T.axis.remap("SS", [i, j])
            hi[vi, vj] = x[vi, vj + 64]
    for i, j, k in T.grid(128, 96, 64):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                y[vi, vj] = T.float32(0)
            y[vi, vj] = y[vi, vj] + T.Cast("float32", lo[vi, vk]) * T.Cast("float32", w[vk, vj])


def test_a_folded_split_with_an_unread_half_still_runs_on_tensor_cores():
    with H100:
        out, _ = tensor_core_matmul(_split_then_matmul, H100, STATIC_SHARED_BYTES, ROOM, SMS)
    assert uses_tensor_cores(out) and "split_hi" not in out.script()


def test_a_3x3_conv_is_an_implicit_gemm_on_tensor_cores():
    """dlight's index maps read the padded input as an im2col: M = H*W, N = out channels, K = C*9."""
    from tvm import topi

    x = te.placeholder((1, 64, 56, 56), "float16", name="x")
    w = te.placeholder((64, 64, 3, 3), "float16", name="w")
    func = te.create_prim_func([x, w, topi.nn.conv2d_nchw(x, w, 1, 1, 1, out_dtype="float32")])
    assert matmul_extents(func) == (1, 3136, 64, 576)
    with H100:
        out, _ = tensor_core_matmul(func, H100, STATIC_SHARED_BYTES, ROOM, SMS)
    assert uses_tensor_cores(out)
