"""`pack verify` tells the truth in both directions: the build's own approximations (reassociation,
fastmath) pass, a wrong kernel fails, even a subtly wrong one."""
from __future__ import annotations

import shutil

import numpy as np

from packager.tools.verify import compare
from support.helpers import run_pack
from support.resign import resign

RTOL, ATOL = 1e-4, 1e-5


def _large_activations(seed: int = 0) -> np.ndarray:
    """An un-normalized CNN's intermediate tensor: magnitudes ~100, some elements cancelling to ~0."""
    x = np.random.default_rng(seed).standard_normal(4096) * 100
    x[::97] = 1e-4
    return x.astype(np.float32)


def test_reassociation_sized_errors_pass_though_plain_allclose_fails():
    ref = _large_activations()
    rng = np.random.default_rng(1)
    ours = (ref + rng.standard_normal(ref.shape) * 3e-6 * 100).astype(np.float32)   # fp32 sums of ~1000 terms
    assert not np.allclose(ours, ref, rtol=RTOL, atol=ATOL)       # what verify used to do: a false FAIL
    max_abs, over_scale, ok, _ = compare(ours, ref, RTOL, ATOL)
    assert ok and over_scale < RTOL and max_abs > ATOL


def test_a_wrong_element_fails():
    ref = _large_activations()
    ours = ref.copy()
    ours[10] += 0.01 * np.abs(ref).max()                            # one element off by 1% of the scale
    assert not compare(ours, ref, RTOL, ATOL)[2]


def test_a_subtly_wrong_kernel_fails():
    ref = _large_activations()
    assert not compare(ref * np.float32(1.001), ref, RTOL, ATOL)[2]  # 0.1% systematic error


def test_special_values_and_integers():
    ref = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    assert compare(ref.copy(), ref, RTOL, ATOL)[2]
    assert not compare(np.array([0.0, np.inf, -np.inf, 1.0], np.float32), ref, RTOL, ATOL)[2]
    assert not compare(np.array([np.nan, np.inf, np.inf, 1.0], np.float32), ref, RTOL, ATOL)[2]
    assert not compare(np.array([np.nan, np.inf, -np.inf, np.nan], np.float32), ref, RTOL, ATOL)[2]
    assert compare(np.arange(4), np.arange(4), RTOL, ATOL)[2]
    assert not compare(np.arange(4) + (np.arange(4) == 2), np.arange(4), RTOL, ATOL)[2]
    assert not compare(np.zeros(3, np.float32), np.zeros(4, np.float32), RTOL, ATOL)[2]


def _requantized(seed: int = 0) -> np.ndarray:
    """A dequantized activation: whole steps of 0.05 around 0."""
    return (np.random.default_rng(seed).integers(-127, 128, 20000) * 0.05).astype(np.float32)


def test_quantization_rounding_flips_pass_only_in_a_model_that_requantizes():
    ref = _requantized()
    ours = ref.copy()
    ours[::500] += 0.05                                             # 0.2% of elements one step off
    assert not compare(ours, ref, RTOL, ATOL)[2]
    assert compare(ours, ref, RTOL, ATOL, flips=0.01)[2:] == (True, 0.002)


def test_a_wrong_kernel_fails_even_where_rounding_flips_are_tolerated():
    ref = _requantized()
    assert not compare(ref * np.float32(1.01), ref, RTOL, ATOL, flips=0.01)[2]   # most elements move
    ours = ref.copy()
    ours[::50] += 0.05                                              # 2% of elements off
    assert not compare(ours, ref, RTOL, ATOL, flips=0.01)[2]
    ours = ref.copy()
    ours[3] = np.nan                                                # a NaN is never a rounding flip
    assert not compare(ours, ref, RTOL, ATOL, flips=0.01)[2]


def test_a_dequantized_tensor_may_be_one_step_off_in_many_elements_but_not_two():
    """Flips that propagated through many quantized layers reach a dequantized output as whole
    steps (a QDQ ResNet-50: 18% of the logits one step off, onnxruntime's own int8 kernels 17%)."""
    ref = _requantized()
    ours = ref.copy()
    ours[::5] += 0.05                                               # 20% one step off
    assert not compare(ours, ref, RTOL, ATOL, flips=0.01)[2]
    assert compare(ours, ref, RTOL, ATOL, flips=0.01, step=0.05)[2:] == (True, 0.2)
    ours[5] += 0.05                                                 # one element two steps off
    assert not compare(ours, ref, RTOL, ATOL, flips=0.01, step=0.05)[2]
    ours = ref.copy()
    ours[::3] += 0.05
    ours[1::3] += 0.05                                              # two thirds shifted: a wrong kernel
    assert not compare(ours, ref, RTOL, ATOL, flips=0.01, step=0.05)[2]


def test_the_reference_spread_widens_the_bound_and_no_further():
    ref = np.array([0.97771], np.float32)                        # smart-turn v3's one logit
    ours = ref + np.float32(0.0032)
    assert not compare(ours, ref, 1e-3, 1e-4, flips=0.01)[2]
    assert compare(ours, ref, 1e-3, 1e-4, flips=0.01, spread=0.0032)[2]
    assert not compare(ref + np.float32(0.01), ref, 1e-3, 1e-4, flips=0.01, spread=0.0032)[2]


def test_weights_off_by_a_tenth_of_a_percent_fail_end_to_end(packages, tmp_path):
    """Every weight of the built CNN scaled by 1.001 (and the manifest re-signed, so the runtime
    loads it): a kernel that is wrong by this little must still FAIL."""
    pkg = tmp_path / "cnn"
    shutil.copytree(packages["cnn"], pkg)
    w = pkg / "targets" / "x86-64" / "weights.bin"
    w.write_bytes((np.frombuffer(w.read_bytes(), np.float32) * np.float32(1.001)).tobytes())
    resign(pkg, "targets/x86-64/weights.bin")
    r = run_pack("verify", pkg, "--target", "x86-64")
    assert r.returncode == 1 and "FAIL" in r.stdout, r.stdout + r.stderr


def test_a_reduced_precision_target_is_checked_at_its_tolerance_with_error_statistics(tmp_path):
    """An fp16 target's outputs pass at fp16's tolerance (its manifest entry), where the spec's fp32
    tolerance would fail them, and verify states what fp16 cost: mean error, argmax agreement."""
    from packager.tools.verify import TargetResult, _checks, _print, _Run

    rng = np.random.default_rng(0)
    ref = rng.standard_normal((8, 10)).astype(np.float32)
    ours = ref.astype(np.float16).astype(np.float32)            # what fp16 storage does to it
    run = _Run(None, [], tmp_path, RTOL, ATOL, 0.0, {}, [], False, tmp_path)
    fp32 = _checks(run, {"y": ours}, {"y": ref}, ["y"], {"name": "x86-64"})
    assert not fp32[0].ok and fp32[0].mean_rel is None
    (c,) = _checks(run, {"y": ours}, {"y": ref}, ["y"],
                   {"name": "h100", "precision": "fp16", "verify": {"rtol": 1e-2, "atol": 1e-3}})
    assert c.ok and c.precision == "fp16" and c.argmax == 1.0 and 0 < c.mean_rel < 1e-3
    lines = []
    _print(lines.append, "m", RTOL, ATOL, 0.0, False, [TargetResult("h100", "default", "pass", outputs=[c])])
    assert "fp16: mean err / scale" in lines[-1] and "argmax agrees in 100.0% of rows" in lines[-1]
