"""Frontend rewrites keep the model's meaning: each rewritten model matches onnxruntime on the
original (run through the packager end to end)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from support.helpers import run_pack, save_model, write_spec
from packager.frontend.model import LoadedModel, TensorInfo
from packager.frontend.shapes import infer_shapes
from packager.frontend.rewrites import rewrite

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


CASES = {
    "pow_int_exponent": model([helper.make_node("Pow", ["x", "e"], ["y"])], [("x", F, [4])], [("y", F, [4])],
                              [numpy_helper.from_array(np.array([2, 3, 1, 0], np.int64), "e")]),
    "layernorm_stats": model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv"], axis=1)],
                             [("x", F, [3, 4, 5])], [("y", F, [3, 4, 5]), ("mean", F, [3, 1, 1]),
                                                     ("inv", F, [3, 1, 1])],
                             [numpy_helper.from_array(np.linspace(0.5, 1.5, 20, dtype=np.float32).reshape(4, 5), "g"),
                              numpy_helper.from_array(np.full((4, 5), 0.1, np.float32), "b")]),
    "split_with_empty_piece": model([helper.make_node("Split", ["x", "sizes"], ["a", "empty", "b"], axis=1)],
                                    [("x", F, [2, 4])], [("a", F, [2, 1]), ("empty", F, [2, 0]), ("b", F, [2, 3])],
                                    [numpy_helper.from_array(np.array([1, 0, 3], np.int64), "sizes")]),
    "reduce_max_bool": model([helper.make_node("Greater", ["x", "zero"], ["pos"]),
                              helper.make_node("ReduceMax", ["pos", "axes"], ["any"], keepdims=0),
                              helper.make_node("Cast", ["any"], ["y"], to=F)],
                             [("x", F, [3, 5])], [("y", F, [3])],
                             [numpy_helper.from_array(np.array(0.5, np.float32), "zero"),
                              numpy_helper.from_array(np.array([1], np.int64), "axes")], opset=20),
    "shape_arithmetic": model([helper.make_node("Shape", ["x"], ["s"]),
                               helper.make_node("Gather", ["s", "i"], ["n"], axis=0),
                               helper.make_node("Concat", ["n", "minus1"], ["ns"], axis=0),
                               helper.make_node("Reshape", ["x", "ns"], ["y"])],
                              [("x", F, [2, 3, 4])], [("y", F, [2, 12])],
                              [numpy_helper.from_array(np.array([0], np.int64), "i"),
                               numpy_helper.from_array(np.array([-1], np.int64), "minus1")]),
    "conv1d": model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[2, 1], strides=[2], dilations=[2], group=2)],
                    [("x", F, [1, 4, 19])], [("y", F, [1, 6, 9])],
                    [numpy_helper.from_array(np.linspace(-1, 1, 36, dtype=np.float32).reshape(6, 2, 3), "w"),
                     numpy_helper.from_array(np.arange(6, dtype=np.float32), "b")]),
    "dropout_with_mask": model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                                helper.make_node("Dropout", ["h", "ratio"], ["y", "mask"]),
                                helper.make_node("Cast", ["mask"], ["m"], to=F)],
                               [("x", F, [1, 8])], [("y", F, [1, 4]), ("m", F, [1, 4])],
                               [numpy_helper.from_array(np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4), "w"),
                                numpy_helper.from_array(np.array(0.5, np.float32), "ratio")]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_rewritten_models_match_onnxruntime(tmp_path, name):
    m = CASES[name]
    save_model(m, tmp_path / "model.onnx")
    r = run_pack("build", write_spec(tmp_path, "name: rw\nmodel: model.onnx\ntargets: [x86-64]\n"))
    assert r.returncode == 0, r.stderr
    r = run_pack("verify", tmp_path / "dist" / "rw")
    assert r.returncode == 0, r.stdout + r.stderr


def test_rewrites_replace_what_they_should():
    m = CASES["shape_arithmetic"]
    loaded = LoadedModel(None, m, 18, [TensorInfo("x", "float32", (2, 3, 4))], [TensorInfo("y", "float32", ())])
    out, changed = rewrite(infer_shapes(loaded, {"x": (2, 3, 4)}))
    assert changed >= 3                                   # Shape constant, then Gather and Concat folded
    assert [n.op_type for n in out.graph.node] == ["Reshape"]
    assert numpy_helper.to_array(next(i for i in out.graph.initializer if i.name == out.graph.node[0].input[1])
                                 ).tolist() == [2, -1]


def test_a_conv1d_becomes_a_conv2d_over_height_one():
    m = CASES["conv1d"]
    loaded = LoadedModel(None, m, 18, [TensorInfo("x", "float32", (1, 4, 19))], [])
    kept, _ = rewrite(infer_shapes(loaded, {"x": (1, 4, 19)}))
    assert [n.op_type for n in kept.graph.node] == ["Conv"]                 # the switch off: unchanged
    out, _ = rewrite(infer_shapes(loaded, {"x": (1, 4, 19)}), conv1d_as_2d=True)
    assert [n.op_type for n in out.graph.node] == ["Unsqueeze", "Conv", "Squeeze"]
    conv = out.graph.node[1]
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    assert attrs["kernel_shape"] == [1, 3] and attrs["pads"] == [0, 2, 0, 1] and attrs["strides"] == [1, 2]
    assert attrs["dilations"] == [1, 2] and attrs["group"] == 2
    w = next(i for i in out.graph.initializer if i.name == conv.input[1])
    assert tuple(w.dims) == (6, 2, 1, 3)


def test_inference_dropout_becomes_identity_and_a_constant_mask():
    m = CASES["dropout_with_mask"]
    loaded = LoadedModel(None, m, 18, [TensorInfo("x", "float32", (1, 8))], [])
    out, changed = rewrite(infer_shapes(loaded, {"x": (1, 8)}))
    assert "Dropout" not in [n.op_type for n in out.graph.node] and changed >= 1
    mask = next(i for i in out.graph.initializer if i.name == "mask")      # the Identity folded
    assert numpy_helper.to_array(mask).all() and tuple(mask.dims) == (1, 4)


def test_reshape_allowzero_without_zeros_loses_the_flag_and_with_zeros_stays_in_ort():
    from packager.frontend.model import unsupported_configuration

    shape = numpy_helper.from_array(np.array([4, -1], np.int64), "shape")
    m = model([helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=1)], [("x", F, [2, 3, 4])],
              [("y", F, [4, 6])], [shape])
    assert unsupported_configuration(m.graph.node[0], m.graph) is None
    loaded = LoadedModel(None, m, 18, [TensorInfo("x", "float32", (2, 3, 4))], [TensorInfo("y", "float32", (4, 6))])
    out, changed = rewrite(infer_shapes(loaded, {"x": (2, 3, 4)}))
    assert changed == 1 and [a.name for a in out.graph.node[0].attribute] == []
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array([0, 4, 6], np.int64), "shape"))
    assert "allowzero=1 with a 0" in unsupported_configuration(m.graph.node[0], m.graph)


def test_an_8bit_weights_dequantize_is_not_folded_and_other_constants_are():
    """The int8 pass reads a QDQ weight's 8-bit values from its DequantizeLinear: folding it to a
    float constant (ONNX's reference evaluator does it from opset 19 on) left 55 of a QDQ
    ShuffleNetV2's 56 convs, every one with a small weight, in float. An int32 bias's
    DequantizeLinear and other constant nodes still fold."""
    wq = numpy_helper.from_array(np.arange(-36, 36, dtype=np.int8).reshape(8, 1, 3, 3), "wq")
    bq = numpy_helper.from_array(np.arange(8, dtype=np.int32), "bq")
    scale, zero = numpy_helper.from_array(np.float32(0.01), "s"), numpy_helper.from_array(np.int8(0), "z")
    m = model([helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["w"]),
               helper.make_node("DequantizeLinear", ["bq", "s"], ["b"]),
               helper.make_node("Neg", ["s"], ["ns"]),
               helper.make_node("Conv", ["x", "w", "b"], ["c"], group=8),
               helper.make_node("Mul", ["c", "ns"], ["y"])],
              [("x", F, [1, 8, 5, 5])], [("y", F, [1, 8, 3, 3])], [wq, bq, scale, zero], opset=21)
    loaded = LoadedModel(None, m, 21, [TensorInfo("x", "float32", (1, 8, 5, 5))], [])
    out, _ = rewrite(infer_shapes(loaded, {"x": (1, 8, 5, 5)}))
    assert [n.op_type for n in out.graph.node] == ["DequantizeLinear", "Conv", "Mul"]
    assert out.graph.node[0].input[0] == "wq"
