"""CumSum and TopK rewritten into plain operators (frontend/selection.py) compute what onnxruntime does."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from packager.frontend.rewrites import rewrite


def _model(node, x_type, shape, operand, outputs) -> onnx.ModelProto:
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", x_type, shape)],
                          [helper.make_empty_tensor_value_info(o) for o in outputs],
                          [numpy_helper.from_array(operand, node.input[1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _both(m: onnx.ModelProto, x: np.ndarray) -> tuple[list, list]:
    lowered, changed = rewrite(onnx.shape_inference.infer_shapes(m))
    assert changed >= 1 and m.graph.node[0].op_type not in {n.op_type for n in lowered.graph.node}
    run = lambda model: ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    return run(lowered), run(m)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum(exclusive, reverse, axis):
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    x = np.random.default_rng(0).standard_normal((3, 6, 9)).astype(np.float32)
    ours, ref = _both(_model(node, TensorProto.FLOAT, [3, 6, 9], np.array(axis, np.int64), ["y"]), x)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-5, atol=1e-5)


def test_cumsum_of_integers_is_exact():
    node = helper.make_node("CumSum", ["x", "axis"], ["y"])
    x = np.random.default_rng(1).integers(-1000, 1000, (4, 12)).astype(np.int64)
    ours, ref = _both(_model(node, TensorProto.INT64, [4, 12], np.array(1, np.int32), ["y"]), x)
    assert ours[0].dtype == np.int64 and (ours[0] == ref[0]).all()


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("axis", [1, -1])
def test_topk_values_indices_and_ties(largest, axis):
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    x = np.random.default_rng(2).integers(0, 5, (3, 7, 8)).astype(np.float32)    # many ties
    ours, ref = _both(_model(node, TensorProto.FLOAT, [3, 7, 8], np.array([4], np.int64), ["v", "i"]), x)
    np.testing.assert_array_equal(ours[0], ref[0])
    np.testing.assert_array_equal(ours[1], ref[1])          # ties: the lower index first, as ONNX says
