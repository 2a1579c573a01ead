"""TileDot kernels (rules/tile_dot.py): the reference loops compute the conv / matmul of bf16
operands in float32 (or of uint8 x int8 in int32) on any CPU; on a target with AMX-BF16 (AMX-INT8)
the CPU rules regenerate them as tile kernels that compute the same (run only where this machine
has AMX)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from packager.optimize.bf16 import bf16_numpy, pack_bf16
from packager.optimize.int8 import pack_conv
from packager.optimize.schedule.rules import tile_dot
from packager.optimize.schedule.rules.cpu import CpuRules
from packager.optimize.schedule.rules.tile_dot import TileDot, reference_kernel
from packager.spec import TargetSpec
from packager.targets import can_run_here, resolve
from support.kernel_cases import host_target, run_kernel

# (channels, out channels, map, kernel, stride, padding, as a matmul's rows)
CASES = [(64, 64, 14, 3, 1, 1, False), (64, 32, 8, 1, 1, 0, True), (96, 48, 10, 3, 2, 1, False),
         (32, 16, 7, 1, 2, 0, False), (64, 16, 12, 1, 1, 0, False)]


def _amx_target():
    target = resolve(TargetSpec("x86-spr", {"kind": "cpu", "arch": "x86_64", "mcpu": "sapphirerapids"}, "test"))
    if not can_run_here(target) or not tile_dot.request_amx():
        pytest.skip("this machine has no AMX-BF16 (or Linux refused its tile state)")
    return target


def _case(c: int, oc: int, size: int, k: int, s: int, pad: int, rows: bool):
    """(TileDot, its arguments, the float32 conv of the bf16-rounded operands)."""
    rng = np.random.default_rng(c + oc + size)
    x = bf16_numpy(rng.standard_normal((1, c, size, size)))
    w = rng.standard_normal((oc, c, k, k)).astype(np.float32)
    xf = (x.astype(np.uint32) << 16).view(np.float32)
    wf = (bf16_numpy(w).astype(np.uint32) << 16).view(np.float32)
    want = torch.nn.functional.conv2d(torch.tensor(xf), torch.tensor(wf), stride=s, padding=pad).numpy()
    out = want.shape[2]
    xp = np.ascontiguousarray(np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)]).transpose(0, 2, 3, 1))
    flat = k == 1 and s == 1 and pad == 0
    g = TileDot(1, xp.shape[1], xp.shape[2], c, oc, k, k, *((1, out * out) if flat else (out, out)), s, s, rows=rows)
    want = want.reshape(oc, -1).T if rows else want.reshape(1, oc, -1)
    return g, [xp, pack_bf16(w, c), np.zeros(want.shape, np.float32)], want


@pytest.mark.parametrize("case", CASES[:3])
def test_the_reference_loops_compute_the_conv_of_the_bf16_operands(case):
    g, args, want = _case(*case)
    got = run_kernel(reference_kernel(g), host_target(), args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("case", CASES)
def test_amx_tiles_compute_what_the_reference_loops_compute(case):
    target = _amx_target()
    g, args, want = _case(*case)
    made, info = CpuRules(target).schedule(reference_kernel(g))
    assert info.rule == "amx" and "llvm.x86.tdpbf16ps" in made.script()
    assert tile_dot.of(made) == g                     # still tagged: the check and the report know it
    np.testing.assert_allclose(run_kernel(made, target, args), want, rtol=1e-5, atol=1e-4)


def test_a_target_without_amx_keeps_the_plain_loops():
    g, _, _ = _case(*CASES[0])
    made, info = CpuRules(resolve(TargetSpec("x86-avx512", {}, "test"))).schedule(reference_kernel(g))
    assert info.rule == "naive" and "no AMX-BF16" in info.note and "tdpbf16ps" not in made.script()


def test_tile_rows_divide_a_row_of_positions():
    assert [TileDot(1, 1, 1, 32, 16, 1, 1, 1, px).tile_rows for px in (56, 49, 3136, 7, 128, 13)] == \
        [14, 7, 16, 7, 16, 13]


def _int8_case(c: int, oc: int, size: int, k: int, s: int, pad: int, rows: bool):
    """(u8s8 TileDot, its arguments, the exact int64 conv): uint8 activations at their extremes
    too, int8 weights down to -128, channels padded to whole 64-byte chunks with zero weights."""
    rng = np.random.default_rng(c + oc + size)
    x = rng.integers(0, 256, (1, c, size, size)).astype(np.uint8)
    x[0, :, 0, 0] = 255
    w = rng.integers(-128, 128, (oc, c, k, k)).astype(np.int8)
    w[0] = -128
    want = torch.nn.functional.conv2d(torch.tensor(x.astype(np.float64)), torch.tensor(w.astype(np.float64)),
                                      stride=s, padding=pad).numpy().astype(np.int64)
    out = want.shape[2]
    cp = c - c % -64
    xp = np.pad(x, [(0, 0), (0, cp - c), (pad, pad), (pad, pad)]).transpose(0, 2, 3, 1)
    flat = k == 1 and s == 1 and pad == 0
    g = TileDot(1, xp.shape[1], xp.shape[2], cp, oc, k, k, *((1, out * out) if flat else (out, out)), s, s, rows=rows,
                kind="u8s8")
    want = want.reshape(oc, -1).T if rows else want.reshape(1, oc, -1)
    panels = pack_conv(np.pad(w, [(0, 0), (0, cp - c), (0, 0), (0, 0)]), 16, 4)
    return g, [np.ascontiguousarray(xp), panels, np.zeros(want.shape, np.int32)], want


INT8_CASES = [(64, 64, 14, 3, 1, 1, False), (128, 32, 8, 1, 1, 0, True), (96, 48, 10, 3, 2, 1, False),
              (64, 16, 12, 1, 1, 0, False)]


@pytest.mark.parametrize("case", INT8_CASES[:2])
def test_the_int8_reference_loops_sum_exactly(case):
    g, args, want = _int8_case(*case)
    np.testing.assert_array_equal(run_kernel(reference_kernel(g), host_target(), args), want)


@pytest.mark.parametrize("case", INT8_CASES)
def test_amx_int8_tiles_sum_what_the_reference_loops_sum(case):
    """tdpbusd tiles (96 channels: a chunk and a half, the rest zero weights): the int32 sums exact."""
    target = _amx_target()
    g, args, want = _int8_case(*case)
    made, info = CpuRules(target).schedule(reference_kernel(g))
    assert info.rule == "amx" and "llvm.x86.tdpbusd" in made.script() and info.note.startswith("tdpbusd")
    assert tile_dot.of(made) == g
    np.testing.assert_array_equal(run_kernel(made, target, args), want)


def test_an_int8_tile_dot_without_amx_int8_keeps_the_plain_loops():
    target = resolve(TargetSpec("x86-bf16-only", {"kind": "cpu", "arch": "x86_64", "mcpu": "x86-64-v4",
                                                  "mattr": ["+amx-tile", "+amx-bf16"]}, "test"))
    g, _, _ = _int8_case(*INT8_CASES[0])
    made, info = CpuRules(target).schedule(reference_kernel(g))
    assert info.rule == "naive" and "no AMX-INT8" in info.note and "tdpbusd" not in made.script()
