"""The reference runner loads what users bring: a model stamped with a newer IR version than this
onnxruntime reads (onnx 1.23 stamps IR 14 by default) runs restamped instead of failing."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from packager.frontend.ort_run import ort_session


def _relu_model(ir_version: int) -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = ir_version
    return m


def test_newer_ir_version_runs_from_bytes_and_from_a_file(tmp_path):
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    model = _relu_model(99)                                 # newer than any onnxruntime reads
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    for source in (model.SerializeToString(), str(path)):
        (y,) = ort_session(source).run(None, {"x": x})
        np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_other_load_errors_still_raise(tmp_path):
    bad = _relu_model(8)
    bad.graph.node[0].op_type = "NoSuchOp"
    try:
        ort_session(bad.SerializeToString())
    except Exception as e:  # noqa: BLE001
        assert "NoSuchOp" in str(e)
        return
    raise AssertionError("an unknown operator loaded")
