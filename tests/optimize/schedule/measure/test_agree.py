"""When a candidate's output agrees with its reference (measure/agree.py): integers exactly, 8-bit
outputs up to a few one-step flips, floats within 1e-4 of the tensor's scale, and kernels that
round through fp16 within fp16's steps even when their output is fp32."""
from __future__ import annotations

import numpy as np
from tvm import te

from packager.optimize.schedule.measure.agree import agree, rounds_through_half


def test_an_fp16_output_one_rounding_step_off_agrees():
    """A blocked fp32 sum rounded to fp16 lands one fp16 step away from the loop-order sum: not a
    wrong schedule (2 of MobileNetV2's fp16 kernels fell back on it). Ten steps off still is."""
    ref = np.linspace(-4, 4, 101).astype(np.float16)
    step = np.float16(4) * np.float16(2 ** -10)
    assert agree((ref.astype(np.float32) + np.float32(step)).astype(np.float16), ref)
    assert not agree((ref.astype(np.float32) + 10 * np.float32(step)).astype(np.float16), ref)
    assert not agree(ref.astype(np.float32) + 1e-3, ref.astype(np.float32))     # fp32 keeps its bound


def test_a_requantized_output_one_step_off_in_few_elements_agrees():
    """A QuantizeLinear epilogue after a reordered float sum: one step off in under 1% of the
    elements agrees; two steps, or one step in many elements, or any flip of a wider integer does
    not."""
    ref = np.arange(1000).astype(np.uint8)
    flip = ref.copy()
    flip[[3, 500]] += 1
    assert agree(flip, ref)
    two = ref.copy()
    two[3] += 2
    assert not agree(two, ref)
    many = ref.copy()
    many[:50] += 1
    assert not agree(many, ref)
    assert not agree(flip.astype(np.int32), ref.astype(np.int32))


def test_a_kernel_rounding_through_fp16_is_held_to_fp16s_tolerance_whatever_its_output_type():
    """An fp32 accumulator cast to fp16, then cast back to an fp32 output (the precision pass's
    conv + bias in fp16): a reordered sum one fp16 step off agrees; an fp32 kernel's does not."""
    x = te.placeholder((8, 64), "float16", name="x")
    w = te.placeholder((64, 16), "float16", name="w")
    k = te.reduce_axis((0, 64), name="k")
    acc = te.compute((8, 16), lambda i, j: te.sum(x[i, k].astype("float32") * w[k, j].astype("float32"), axis=k))
    out = te.compute((8, 16), lambda i, j: acc[i, j].astype("float16").astype("float32"), name="out")
    assert rounds_through_half(te.create_prim_func([x, w, out]))
    xf = te.placeholder((8, 64), name="xf")
    assert not rounds_through_half(te.create_prim_func([xf, te.compute((8, 64), lambda i, j: xf[i, j] * 2.0)]))
    ref = np.linspace(64, 128, 101).astype(np.float32)
    one_step = ref + np.float32(2 ** -6)                 # an fp16 step at 64..128 is 2^-4; a quarter of it
    assert agree(one_step, ref, half=True) and not agree(one_step, ref)
    assert not agree(ref + 1.0, ref, half=True)
