"""Static-shape folding with onnxruntime: exporter shape arithmetic becomes constants once the spec
binds the inputs, results do not change, and nothing but constant folding runs."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T, helper, numpy_helper as nh

from packager.frontend.fold import fold_constants
from packager.frontend.model import LoadedModel, TensorInfo
from packager.frontend.shapes import bind_dims
from packager.frontend.relax_import import import_relax
from support.helpers import ort_run


def _i64(name: str, v) -> onnx.TensorProto:
    return nh.from_array(np.array(v, np.int64), name)


def exporter_reshapes() -> onnx.ModelProto:
    """PyTorch-style `x.view(x.size(0), x.size(1) // 2, -1)` then `y.view(y.size(0), -1) * 2`,
    the halving done in float (Cast -> Mul -> Floor -> Cast), as upsampling exports write it."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["c"], axis=0),
        helper.make_node("Cast", ["c"], ["cf"], to=T.FLOAT),
        helper.make_node("Mul", ["cf", "half"], ["hf"]),
        helper.make_node("Floor", ["hf"], ["hfl"]),
        helper.make_node("Cast", ["hfl"], ["h"], to=T.INT64),
        helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
        helper.make_node("Unsqueeze", ["h", "ax"], ["h1"]),
        helper.make_node("Concat", ["n1", "h1", "m1"], ["shape1"], axis=0),
        helper.make_node("Reshape", ["x", "shape1"], ["y"]),
        helper.make_node("Relu", ["y"], ["yr"]),
        helper.make_node("Shape", ["yr"], ["s2"]),
        helper.make_node("Slice", ["s2", "st", "en"], ["s2a"]),
        helper.make_node("Concat", ["s2a", "m1"], ["shape2"], axis=0),
        helper.make_node("Reshape", ["yr", "shape2"], ["z0"]),
        helper.make_node("Mul", ["z0", "two"], ["z"]),
    ]
    inits = [_i64("i0", 0), _i64("i1", 1), _i64("ax", [0]), _i64("m1", [-1]), _i64("st", [0]), _i64("en", [1]),
             nh.from_array(np.array(0.5, np.float32), "half"), nh.from_array(np.array(2, np.float32), "two")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 8, 4])],
                          [helper.make_tensor_value_info("z", T.FLOAT, ["b", "k"])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_shape_arithmetic_folds_to_constants_without_changing_results(tmp_path):
    model = exporter_reshapes()
    out = fold_constants(bind_dims(model, {"x": (2, 8, 4)}))
    assert not out.note
    assert [n.op_type for n in out.model.graph.node] == ["Reshape", "Relu", "Reshape", "Mul"]
    assert out.removed == len(model.graph.node) - 4
    x = np.random.default_rng(0).standard_normal((2, 8, 4)).astype(np.float32)
    onnx.save(model, str(tmp_path / "a.onnx"))
    onnx.save(out.model, str(tmp_path / "b.onnx"))
    np.testing.assert_array_equal(ort_run(tmp_path / "b.onnx", {"x": x})["z"], ort_run(tmp_path / "a.onnx", {"x": x})["z"])


def test_only_constant_folding_runs():
    """Conv+BatchNorm fusion, CSE and constant sharing are the packager's own passes (with spec
    switches): onnxruntime must leave them alone."""
    ones = [nh.from_array(np.ones(4, np.float32), k) for k in "sbmv"]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r1"]), helper.make_node("Relu", ["bn"], ["r2"]),
             helper.make_node("Add", ["r1", "r2"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, 4, 8, 8])],
                          [nh.from_array(np.ones((4, 3, 3, 3), np.float32), "w"), *ones])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    out = fold_constants(m)
    assert [n.op_type for n in out.model.graph.node] == ["Conv", "BatchNormalization", "Relu", "Relu", "Add"]
    assert sorted(i.name for i in out.model.graph.initializer) == ["b", "m", "s", "v", "w"]
    assert [(o.domain, o.version) for o in out.model.opset_import] == [("", 17)]


def test_weights_listed_as_inputs_still_fold():
    """IR-3 exporters list initializers as graph inputs; folding must not treat them as overridable."""
    nodes = [helper.make_node("Shape", ["w"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [6]),
                                       helper.make_tensor_value_info("w", T.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])], [nh.from_array(np.ones((2, 3), np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 3
    out = fold_constants(m)
    assert [n.op_type for n in out.model.graph.node] == ["Reshape"] and out.removed == 1


def test_a_model_onnxruntime_cannot_load_is_left_to_our_rewrites():
    nodes = [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    out = fold_constants(m)
    assert out.model is m and out.removed == 0 and "onnxruntime could not load the model" in out.note


def test_import_reports_what_the_frontend_folded(tmp_path):
    model = exporter_reshapes()
    onnx.save(model, str(tmp_path / "m.onnx"))
    loaded = LoadedModel(tmp_path / "m.onnx", model, 17, [TensorInfo("x", "float32", ("batch", 8, 4))],
                         [TensorInfo("z", "float32", ("b", "k"))])
    mod, stats = import_relax(loaded, {"x": (2, 8, 4)}, {"x": "float32"})
    assert stats.folded == len(model.graph.node) - 4 and stats.as_dict()["folded_by_onnxruntime"] == stats.folded
    assert "R.shape_of" not in mod.script() and "R.reshape" in mod.script()


def test_weights_no_fold_reads_skip_onnxruntime_and_come_back_unchanged(monkeypatch):
    """A weight only a MatMul on activations reads never folds, so onnxruntime gets it as a graph
    input (no copy of its values); a weight a Transpose reads still folds. The result keeps both
    as initializers with their values, and no weight is left as a graph input."""
    import onnxruntime as ort
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal((64, 64)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Transpose", ["w2"], ["w2t"], perm=[1, 0]),
             helper.make_node("MatMul", ["h", "w2t"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 64])],
                          [nh.from_array(w1, "w1"), nh.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    seen = []
    session = ort.InferenceSession
    monkeypatch.setattr(ort, "InferenceSession", lambda data, *a, **k: seen.append(onnx.load_from_string(data))
                        or session(data, *a, **k))
    out = fold_constants(m)
    assert not out.note
    assert [i.name for i in seen[0].graph.input] == ["x", "w1"] and [i.name for i in seen[0].graph.initializer] == ["w2"]
    assert [n.op_type for n in out.model.graph.node] == ["MatMul", "MatMul"] and out.removed == 1
    assert [i.name for i in out.model.graph.input] == ["x"]
    inits = {i.name: nh.to_array(i) for i in out.model.graph.initializer}
    np.testing.assert_array_equal(inits["w1"], w1)
    folded = next(v for k, v in inits.items() if k != "w1")
    np.testing.assert_array_equal(folded, w2.T)
