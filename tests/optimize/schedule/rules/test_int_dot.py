"""The int-dot CPU rule (rules/int_dot.py): the integer matmul or conv of a QDQ model is tiled, its
k pairs tensorized into vpmaddwd on x86 (vectorized loops on arm64), the epilogue computed per
tile, the result exact; Gensor leaves the kernel to it."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from packager.optimize.int8 import PANEL, int_conv, int_matmul, pack_conv, pack_panels, padded
from packager.optimize.schedule.gensor.cpu import GensorCpu
from packager.optimize.schedule.measure.database import TuningDatabase
from packager.optimize.schedule.rules.cpu import CpuRules
from packager.optimize.schedule.rules.int_dot import PAIR, QUAD, integer_dots
from packager.optimize.schedule.tir_util import RuleMismatch
from packager.spec import TargetSpec
from packager.targets import can_run_here, resolve
from support.kernel_cases import host_target, run_kernel


def _kernel(m: int = 12, k: int = 64, n: int = 48, lanes: int = PANEL):
    """int16 activations x int8 pair panels -> int32 -> float scale per column (an epilogue)."""
    a = te.placeholder((1, m, k), "int16", "a")
    panels = te.placeholder((n // lanes, k // 2, lanes, 2), "int8", "w")
    scale = te.placeholder((n,), "float32", "s")
    if lanes == PANEL:
        acc = int_matmul(a, panels)
    else:
        ko, ki = te.reduce_axis((0, k // 2), "ko"), te.reduce_axis((0, 2), "ki")
        acc = te.compute((1, m, n), lambda b, i, j: te.sum(
            a[b, i, 2 * ko + ki].astype("int32") * panels[j // lanes, ko, j % lanes, ki].astype("int32"),
            axis=[ko, ki]), name="matmul_int8")
    y = te.compute((1, m, n), lambda b, i, j: acc[b, i, j].astype("float32") * scale[j], name="scaled")
    return te.create_prim_func([a, panels, scale, y])


def test_the_kernel_is_exact_and_uses_vpmaddwd():
    target = host_target()
    func = _kernel()
    scheduled, info = CpuRules(target).schedule(func)
    assert info.rule == "int-dot" and info.note == "vpmaddwd" and info.register_tile == 12
    assert "llvm.x86.avx2.pmadd.wd" in scheduled.script()
    rng = np.random.default_rng(0)
    a = rng.integers(-255, 256, (1, 12, 64)).astype(np.int16)
    w = rng.integers(-128, 128, (64, 48)).astype(np.int8)
    s = rng.uniform(0.5, 2, 48).astype(np.float32)
    got = run_kernel(scheduled, target, [a, pack_panels(w), s, np.zeros((1, 12, 48), np.float32)])
    want = (a[0].astype(np.int64) @ w.astype(np.int64)).astype(np.float32) * s
    np.testing.assert_array_equal(got[0], want)


def test_rows_and_panels_that_do_not_divide_by_the_tile():
    """7 rows and 5 panels (primes): the tile takes divisors (1 row, 1 vector), never a tail."""
    target = host_target()
    func = _kernel(m=7, k=16, n=40)
    scheduled, info = CpuRules(target).schedule(func)
    assert info.rule == "int-dot" and info.register_tile == 1
    rng = np.random.default_rng(1)
    a = rng.integers(-255, 256, (1, 7, 16)).astype(np.int16)
    w = rng.integers(-128, 128, (16, 40)).astype(np.int8)
    s = np.ones(40, np.float32)
    got = run_kernel(scheduled, target, [a, pack_panels(w), s, np.zeros((1, 7, 40), np.float32)])
    np.testing.assert_array_equal(got[0], (a[0].astype(np.int64) @ w.astype(np.int64)).astype(np.float32))


def test_an_epilogue_input_the_matmul_does_not_produce():
    """A residual add whose other operand is dequantized inside the kernel (QDQ BERT): that
    dequantize reads nothing of the tile and is inlined into the add (computed at the tile it
    would compute the whole tensor per tile, into a per-task buffer: BERT's kernels disagreed
    with their loops by 1.87), and every column is right."""
    target = host_target()
    a = te.placeholder((1, 8, 32), "int16", "a")
    panels = te.placeholder((48 // PANEL, 16, PANEL, 2), "int8", "w")
    residual = te.placeholder((1, 8, 48), "uint8", "r")
    acc = int_matmul(a, panels)
    scaled = te.compute((1, 8, 48), lambda b, i, j: acc[b, i, j].astype("float32") * 0.5, name="scaled")
    deq = te.compute((1, 8, 48), lambda b, i, j: (residual[b, i, j].astype("int32") - 128).astype("float32"),
                     name="dequantized")
    y = te.compute((1, 8, 48), lambda b, i, j: scaled[b, i, j] + deq[b, i, j], name="residual_add")
    func = te.create_prim_func([a, panels, residual, y])
    scheduled, info = CpuRules(target).schedule(func)
    assert info.rule == "int-dot" and "after the matmul" not in info.note
    assert 'sblock("dequantized")' not in scheduled.script()
    rng = np.random.default_rng(3)
    an = rng.integers(-255, 256, (1, 8, 32)).astype(np.int16)
    wn = rng.integers(-128, 128, (32, 48)).astype(np.int8)
    rn = rng.integers(0, 256, (1, 8, 48)).astype(np.uint8)
    got = run_kernel(scheduled, target, [an, pack_panels(wn), rn, np.zeros((1, 8, 48), np.float32)])
    want = (an[0].astype(np.int64) @ wn.astype(np.int64)).astype(np.float32) * 0.5 + (rn[0].astype(np.float32) - 128)
    np.testing.assert_array_equal(got[0], want)


def test_arm64_vectorizes_the_same_loops():
    arm = resolve(TargetSpec("arm64", {}, "test"))
    scheduled, info = CpuRules(arm).schedule(_kernel())
    assert info.rule == "int-dot" and info.note == "vectorized"
    assert "pmadd" not in scheduled.script()
    lib = tvm.tirx.build(tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}),
                         target=tvm.target.Target(arm.llvm_target()))
    assert "smlal" in lib.inspect_source("asm")          # NEON widening 16-bit multiply-accumulate


def test_other_panel_widths_are_refused():
    from packager.optimize.schedule.rules.int_dot import int_dot

    with pytest.raises(RuleMismatch, match="no form of 4 lanes x 2"):
        int_dot(CpuRules(resolve(TargetSpec("x86-64", {}, "test"))), _kernel(lanes=4))


def test_gensor_leaves_the_kernel_to_the_rule(tmp_path):
    g = GensorCpu(resolve(TargetSpec("x86-64", {}, "test")), TuningDatabase(tmp_path / "db.json"), measure=False,
                  top_k=1)
    assert g.workload(_kernel()) is None


def _conv_kernel(n: int, c: int, hw: tuple[int, int], oc: int, k: int, stride: int, pad: int, dil: int):
    """A pair-padded NHWC int16 input x conv panels -> int32 -> float scale per output channel."""
    h, w = hw
    xp = te.placeholder((n, h + 2 * pad, w + 2 * pad, c + c % 2), "int16", "xp")
    panels = te.placeholder((padded(oc, PANEL) // PANEL, k, k, (c + 1) // 2, PANEL, 2), "int8", "w")
    out_hw = tuple((d + 2 * pad - dil * (k - 1) - 1) // stride + 1 for d in hw)
    acc = int_conv(xp, panels, list(out_hw), [stride, stride], [dil, dil], oc)
    scale = te.placeholder((oc, 1, 1), "float32", "s")
    y = te.compute((n, oc, *out_hw), lambda b, o, i, j: acc[b, o, i, j].astype("float32") * scale[o, 0, 0],
                   name="scaled")
    return te.create_prim_func([xp, panels, scale, y]), out_hw


def _conv_reference(x: np.ndarray, w: np.ndarray, stride: int, pad: int, dil: int, out_hw) -> np.ndarray:
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((x.shape[0], w.shape[0], *out_hw), np.int64)
    for ky in range(w.shape[2]):
        for kx in range(w.shape[3]):
            win = xp[:, :, ky * dil::stride, kx * dil::stride][:, :, :out_hw[0], :out_hw[1]]
            out += np.einsum("nchw,oc->nohw", win, w[:, :, ky, kx].astype(np.int64))
    return out


@pytest.mark.parametrize("n,c,hw,oc,k,stride,pad,dil,tile", [
    (1, 16, (8, 8), 24, 3, 1, 1, 1, 12),      # 72 k-pair steps: 4 positions along x x 3 vectors, nothing spilled
    (1, 3, (15, 15), 16, 3, 2, 1, 1, 16),     # 3 channels (a zero channel completes the pairs): 18 steps, 8 x 2
    (2, 16, (8, 8), 24, 3, 1, 2, 2, 12),      # dilated, two images
    (1, 8, (12, 1), 16, 1, 1, 0, 1, 12),      # a map one wide: 6 positions along y x 2 vectors
    (1, 12, (6, 6), 12, 1, 1, 0, 1, 12),      # 12 channels: the second panel half zero columns, never written
])
def test_a_conv_is_exact_and_uses_vpmaddwd(n, c, hw, oc, k, stride, pad, dil, tile):
    target = host_target()
    func, out_hw = _conv_kernel(n, c, hw, oc, k, stride, pad, dil)
    scheduled, info = CpuRules(target).schedule(func)
    assert info.rule == "int-dot" and info.note == "vpmaddwd" and info.register_tile == tile
    assert "llvm.x86.avx2.pmadd.wd" in scheduled.script()
    rng = np.random.default_rng(7)
    x = rng.integers(-255, 256, (n, c, *hw)).astype(np.int16)
    w = rng.integers(-128, 128, (oc, c, k, k)).astype(np.int8)
    s = rng.uniform(0.5, 2, (oc, 1, 1)).astype(np.float32)
    xp = np.zeros((n, hw[0] + 2 * pad, hw[1] + 2 * pad, c + c % 2), np.int16)
    xp[:, pad:pad + hw[0], pad:pad + hw[1], :c] = x.transpose(0, 2, 3, 1)
    got = run_kernel(scheduled, target, [xp, pack_conv(w), s, np.zeros((n, oc, *out_hw), np.float32)])
    np.testing.assert_array_equal(got, _conv_reference(x, w, stride, pad, dil, out_hw).astype(np.float32) * s)


def test_gensor_leaves_a_conv_to_the_rule(tmp_path):
    g = GensorCpu(resolve(TargetSpec("x86-64", {}, "test")), TuningDatabase(tmp_path / "db.json"), measure=False,
                  top_k=1)
    assert g.workload(_conv_kernel(1, 16, (8, 8), 24, 3, 1, 1, 1)[0]) is None


def test_a_conv1d_is_exact():
    """NCW: positions along x, one spatial loop (an audio model's feature convs)."""
    target = host_target()
    xp = te.placeholder((1, 22, 6), "int16", "xp")                        # 20 samples, padding 1 each side
    panels = te.placeholder((16 // PANEL, 3, 3, PANEL, 2), "int8", "w")
    acc = int_conv(xp, panels, [10], [2], [1])
    y = te.compute((1, 16, 10), lambda b, o, i: acc[b, o, i].astype("float32"), name="scaled")
    scheduled, info = CpuRules(target).schedule(te.create_prim_func([xp, panels, y]))
    assert info.rule == "int-dot" and info.note == "vpmaddwd" and info.register_tile == 10
    rng = np.random.default_rng(8)
    x = rng.integers(-255, 256, (1, 6, 20)).astype(np.int16)
    w = rng.integers(-128, 128, (16, 6, 3)).astype(np.int8)
    xpn = np.zeros((1, 22, 6), np.int16)
    xpn[:, 1:21] = x.transpose(0, 2, 1)
    got = run_kernel(scheduled, target, [xpn, pack_conv(w), np.zeros((1, 16, 10), np.float32)])
    want = _conv_reference(np.pad(x, ((0, 0), (0, 0), (1, 1)))[:, :, None], w[:, :, None], 2, 0, 1, (1, 10))
    np.testing.assert_array_equal(got, want[:, :, 0].astype(np.float32))


def _vnni_target():
    """The named AVX-512 VNNI row; its kernels run only where the host has the extension."""
    target = resolve(TargetSpec("x86-avx512-vnni", {}, "test"))
    if not can_run_here(target):
        pytest.skip("this machine has no AVX-512 VNNI")
    return target


def test_vnni_targets_take_quads_first_and_others_pairs():
    quads = resolve(TargetSpec("x86-avx512-vnni", {}, "test"))
    assert integer_dots(quads) == (QUAD, PAIR) and "avx512_vnni" in quads.features
    assert integer_dots(resolve(TargetSpec("x86-avx512", {}, "test"))) == (PAIR,)
    assert integer_dots(resolve(TargetSpec("x86-avx2", {}, "test"))) == (PAIR,)
    assert integer_dots(resolve(TargetSpec("arm64", {}, "test"))) == (PAIR,)


def test_a_quad_kernel_is_refused_where_the_target_has_no_vnni():
    func, _ = _quad_conv_kernel(16, (6, 6), 16, 3, 1, 1)
    with pytest.raises(RuleMismatch, match="vpdpbusd not on target"):
        from packager.optimize.schedule.rules.int_dot import int_dot
        int_dot(CpuRules(resolve(TargetSpec("x86-avx512", {}, "test"))), func)


def _quad_conv_kernel(c: int, hw: tuple[int, int], oc: int, k: int, stride: int, pad: int):
    """A channels-last uint8 input (C in groups of 4) x quad panels -> int32 -> float scale."""
    h, w = hw
    xp = te.placeholder((1, h + 2 * pad, w + 2 * pad, c - c % -4), "uint8", "xp")
    panels = te.placeholder((padded(oc, 16) // 16, k, k, -(-c // 4), 16, 4), "int8", "w")
    out_hw = tuple((d + 2 * pad - k) // stride + 1 for d in hw)
    acc = int_conv(xp, panels, list(out_hw), [stride, stride], [1, 1], oc)
    scale = te.placeholder((oc, 1, 1), "float32", "s")
    y = te.compute((1, oc, *out_hw), lambda b, o, i, j: acc[b, o, i, j].astype("float32") * scale[o, 0, 0],
                   name="scaled")
    return te.create_prim_func([xp, panels, scale, y]), out_hw


@pytest.mark.parametrize("c,hw,oc,k,stride,pad", [
    (16, (8, 8), 32, 3, 1, 1),       # 36 k-quad steps, two panels of 16 channels
    (3, (15, 15), 16, 3, 2, 1),      # 3 channels filled to 4 (the pass fills with the zero point; here 0)
    (64, (7, 7), 48, 1, 1, 0),       # a 7x7 map: 7 positions x 3 vectors, the epilogue over 7 positions
    (116, (7, 7), 116, 1, 1, 0),     # ShuffleNetV2's 116 channels: 8 panels, the last 4 real columns of 16
    (3, (16, 16), 24, 3, 2, 1),      # a stem to 24 channels: one and a half panels
])
def test_a_quad_conv_is_exact_and_uses_vpdpbusd(c, hw, oc, k, stride, pad):
    target = _vnni_target()
    func, out_hw = _quad_conv_kernel(c, hw, oc, k, stride, pad)
    scheduled, info = CpuRules(target).schedule(func)
    assert info.rule == "int-dot" and info.note == "vpdpbusd" and info.vector == 16
    assert "llvm.x86.avx512.vpdpbusd.512" in scheduled.script()
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (1, c, *hw)).astype(np.uint8)
    w = rng.integers(-128, 128, (oc, c, k, k)).astype(np.int8)
    s = rng.uniform(0.5, 2, (oc, 1, 1)).astype(np.float32)
    xp = np.zeros((1, hw[0] + 2 * pad, hw[1] + 2 * pad, c - c % -4), np.uint8)
    xp[:, pad:pad + hw[0], pad:pad + hw[1], :c] = x.transpose(0, 2, 3, 1)
    got = run_kernel(scheduled, target, [xp, pack_conv(w, 16, 4), s, np.zeros((1, oc, *out_hw), np.float32)])
    want = _conv_reference(x.astype(np.int64), w, stride, pad, 1, out_hw)
    np.testing.assert_array_equal(got, want.astype(np.float32) * s)


@pytest.mark.parametrize("n", [48, 40])
def test_a_quad_matmul_is_exact(n):
    """uint8 rows x [N/16, K/4, 16, 4] panels: the largest sums (255 x -128 x K) stay exact; 40
    columns end in a half panel whose zero columns are not written."""
    target = _vnni_target()
    a = te.placeholder((1, 24, 128), "uint8", "a")
    panels = te.placeholder((3, 32, 16, 4), "int8", "w")
    acc = int_matmul(a, panels, n)
    y = te.compute((1, 24, n), lambda b, i, j: acc[b, i, j], name="out")
    scheduled, info = CpuRules(target).schedule(te.create_prim_func([a, panels, y]))
    assert info.rule == "int-dot" and info.note == "vpdpbusd"
    rng = np.random.default_rng(4)
    an = rng.integers(0, 256, (1, 24, 128)).astype(np.uint8)
    an[0, 0] = 255
    wn = rng.integers(-128, 128, (128, n)).astype(np.int8)
    wn[:, 0] = -128
    got = run_kernel(scheduled, target, [an, pack_panels(wn, 16, 4), np.zeros((1, 24, n), np.int32)])
    np.testing.assert_array_equal(got[0], an[0].astype(np.int64) @ wn.astype(np.int64))
