"""When a candidate kernel's output agrees with its reference: the untimed check's rule
(check.py, against the unscheduled loops), which the timed check (timing.py, against the first
candidate) also applies to kernels that round through fp16.

A schedule reorders float sums, so outputs differ in their last bits. Where a kernel rounds
through fp16 (a reduced-precision build: an fp32 accumulator cast to fp16, then the bias added in
fp16), a reordered sum can land one fp16 step away, 2^-11 of the value, however the kernel's
output is typed: its tolerance is fp16's. Exact for integers, except 8-bit outputs (below).
"""
from __future__ import annotations

import numpy as np
import tvm_ffi
from tvm import s_tir, tirx

RTOL = 1e-4            # of the reference tensor's largest finite |value|: blocked fp32 sums reorder
HALF_RTOL = 2e-3       # the same where the kernel rounds through fp16 or bf16: about 4 fp16 steps
HALVES = ("float16", "bfloat16")
STEP_FLIPS = 0.01      # of an 8-bit output's elements that may be one quantization step off


def rounds_through_half(func: tirx.PrimFunc) -> bool:
    """Whether `func` reads, writes or keeps an fp16/bf16 buffer anywhere (parameters included)."""
    if any(str(p.dtype) in HALVES for p in func.params):
        return True
    blocks: list = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, blocks.append), order="post")
    return any(str(r.source.dtype) in HALVES for b in blocks for r in (*b.reads, *b.writes))


def agree(got: np.ndarray, ref: np.ndarray, half: bool = False) -> bool:
    """Equal for integers, except that an 8-bit output (a QuantizeLinear's) may be one step off in
    up to STEP_FLIPS of its elements: a reordered float sum just below a rounding boundary lands
    one step over (QDQ BERT's softmax and layer-norm kernels fell back to slower schedules on it).
    For floats within RTOL (HALF_RTOL when `half`) of the reference's largest finite |value|, with
    NaN where it has NaN and the same infinities."""
    if got.dtype.kind != "f":
        if got.dtype.itemsize != 1 or got.dtype == np.bool_:
            return np.array_equal(got, ref)
        off = np.abs(got.astype(np.int16) - ref.astype(np.int16))
        return bool(off.max(initial=0) <= 1 and np.count_nonzero(off) <= STEP_FLIPS * off.size)
    finite = np.abs(ref[np.isfinite(ref)].astype(np.float64))
    scale = float(finite.max()) if finite.size else 0.0
    rtol = HALF_RTOL if half or str(ref.dtype) in HALVES else RTOL
    atol = rtol * (scale or 1.0) + 1e-6
    return bool(np.allclose(got.astype(np.float64), ref.astype(np.float64), rtol=0.0, atol=atol, equal_nan=True))
