"""The allowances of a quantizing model (frontend/rounding.py): rounding flips only where
activations are re-quantized, a quantization step for every tensor a per-tensor
DequantizeLinear produces (not a per-channel one)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from packager.frontend.rounding import ROUNDING_FLIPS, SPREAD_TRIALS, flips_for, quantization_steps, reference_spread


def _qdq(scale: np.ndarray, requantize: bool = True):
    consts = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
              numpy_helper.from_array(np.array(0, np.uint8), "z"),
              numpy_helper.from_array(scale, "ws"),
              numpy_helper.from_array(np.zeros(scale.shape, np.int8), "wz"),
              numpy_helper.from_array(np.ones((4, 4), np.int8), "w")]
    nodes = [helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0),
             helper.make_node("MatMul", ["x", "wf"], ["m"])]
    if requantize:
        nodes += [helper.make_node("QuantizeLinear", ["m", "s", "z"], ["q"]),
                  helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    else:
        nodes += [helper.make_node("Identity", ["m"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], consts)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_requantizing_model_gets_flips_and_per_tensor_steps():
    m = _qdq(np.array([0.1, 0.2, 0.3, 0.4], np.float32))     # per-channel weights: no single step
    assert flips_for(m) == ROUNDING_FLIPS
    assert quantization_steps(m) == {"y": np.float32(0.05).item()}


def test_weight_only_quantization_gets_neither():
    m = _qdq(np.array(0.1, np.float32), requantize=False)
    assert flips_for(m) == 0.0 and quantization_steps(m) == {}


def test_the_spread_is_how_far_the_reference_moves_under_float_noise():
    """A quantizing model's output jumps a step when float noise moves a value across a rounding
    boundary; the spread is the largest such jump over the seeded trials, per output."""
    calls = []

    def run(feeds):
        calls.append(feeds)
        x = feeds["x"]
        return {"q": np.round(x * 1000) / 1000, "exact": x.astype(np.float64) * 2, "ids": np.arange(3)}

    x = np.array([0.0005, 1.0, 2.0], np.float32)              # the first sits on a rounding boundary
    feeds = {"x": x, "ids": np.arange(3)}
    spread = reference_spread(run, feeds, run(feeds))
    assert len(calls) == 1 + SPREAD_TRIALS and np.array_equal(calls[1]["ids"], np.arange(3))
    assert spread["q"] == pytest.approx(0.001, abs=1e-6)        # one step of the rounded output
    assert spread["exact"] < 1e-3 and "ids" not in spread       # float noise only; integers never move
