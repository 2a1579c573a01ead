"""How far a correct package of a quantizing model may be from onnxruntime (used by `pack
verify`, and written into reference.json for `packrt-run --check`).

In a model that quantizes activations, a value within float noise of a rounding boundary lands on
the neighbouring integer step, and what consumes it inherits that. Two allowances follow:

* `flips`: up to ROUNDING_FLIPS of a tensor's elements may be outside the float bound (a few
  flips reach the outputs; smart-turn v3's QDQ transformer: < 0.4%).
* `steps`: a tensor a DequantizeLinear produces lies on its quantization grid, so flips that
  propagated through many layers show up there as whole steps. Such a tensor may be off by at most
  one step per element, in at most STEP_SHARE of its elements; more than one step, or a shift of
  most elements, is a wrong kernel. Measured on a QDQ ResNet-50 (onnxruntime quantize_static,
  per-channel, u8/s8): onnxruntime's own int8 kernels differ from its float evaluation of the same
  graph by exactly one output step in 17% of the elements, and our package by one step in 18%.
* `spread`: how far onnxruntime's own outputs move when the float inputs move by SPREAD_EPS
  (relative), over SPREAD_TRIALS seeded perturbations: the model's sensitivity to float noise.
  Every element may be off by that much besides the float bound. smart-turn v3 (a QDQ
  transformer, one logit): its float noise moves onnxruntime's logit in steps of 0.0008 up to
  0.0032, and an h100 schedule run on PoCL lands 0.0032 off. A wrong kernel is off by far more.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

REQUANTIZE_OPS = {"QuantizeLinear", "DynamicQuantizeLinear"}
ROUNDING_FLIPS = 0.01              # share of elements a model that re-quantizes activations may have off
STEP_SHARE = 0.5                   # share of a dequantized tensor's elements that may be one step off
SPREAD_EPS, SPREAD_TRIALS = 1e-5, 8  # relative float noise on the inputs; how many perturbed runs


def flips_for(proto: onnx.ModelProto) -> float:
    """The share of elements allowed a rounding flip off: ROUNDING_FLIPS for a model that
    re-quantizes activations, else none."""
    return ROUNDING_FLIPS if any(n.op_type in REQUANTIZE_OPS for n in proto.graph.node) else 0.0


def quantization_steps(proto: onnx.ModelProto) -> dict[str, float]:
    """Tensor -> its quantization step, for every tensor of a re-quantizing model that a
    DequantizeLinear with one constant scale produces (per-tensor quantization)."""
    if not flips_for(proto):
        return {}
    scales = {t.name: t for t in proto.graph.initializer}
    scales.update({n.output[0]: a.t for n in proto.graph.node if n.op_type == "Constant"
                   for a in n.attribute if a.name == "value"})
    steps = {}
    for n in proto.graph.node:
        if n.op_type == "DequantizeLinear" and len(n.input) > 1 and n.input[1] in scales:
            scale = numpy_helper.to_array(scales[n.input[1]])
            if scale.size == 1 and np.isfinite(scale).all() and float(scale.ravel()[0]) > 0:
                steps[n.output[0]] = float(scale.ravel()[0])
    return steps


def reference_spread(run, inputs: dict[str, np.ndarray], base: dict[str, np.ndarray]) -> dict[str, float]:
    """Tensor -> the largest change of the reference's value `base` (what `run` gives for
    `inputs`) over SPREAD_TRIALS runs of `run` (inputs -> tensors) with every float input
    perturbed by SPREAD_EPS relative noise (seeded)."""
    rng = np.random.default_rng(0)
    spread = {name: 0.0 for name in base}
    for _ in range(SPREAD_TRIALS):
        moved = {k: (v * (1 + SPREAD_EPS * rng.standard_normal(v.shape))).astype(v.dtype)
                 if np.issubdtype(v.dtype, np.floating) else v for k, v in inputs.items()}
        for name, value in run(moved).items():
            if name in base and np.issubdtype(np.asarray(value).dtype, np.floating):
                diff = np.abs(np.asarray(value, np.float64) - np.asarray(base[name], np.float64))
                finite = diff[np.isfinite(diff)]
                spread[name] = max(spread[name], float(finite.max(initial=0)))
    return {n: v for n, v in spread.items() if v > 0}
