"""Shape inference on a copy without the weights: the same types as inferring with them, the
weights kept (or left out on request), and subgraph types copied back."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T, helper, numpy_helper as nh

from packager.frontend.model import LoadedModel, TensorInfo
from packager.frontend.shapes import SMALL_CONSTANT, infer_shapes, without_large_constants

N = 64                      # 64 x 64 weights: above SMALL_CONSTANT elements


def _model() -> onnx.ModelProto:
    """MatMul by a large weight, a Reshape whose target comes from a small constant (data_prop),
    and an If whose branches compute on the result (types inside subgraphs)."""
    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["r"], [f"{name}_out"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", T.FLOAT, None)])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Reshape", ["h", "target"], ["r"]),
             helper.make_node("If", ["flag"], ["y"], then_branch=branch("then", "Relu"),
                              else_branch=branch("else", "Neg"))]
    inits = [nh.from_array(np.ones((N, N), np.float32), "w"), nh.from_array(np.array([-1, 2, N], np.int64), "target")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", N]),
                                       helper.make_tensor_value_info("flag", T.BOOL, [])],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="test")
    m.ir_version = 8
    return m


def _loaded(m: onnx.ModelProto) -> LoadedModel:
    return LoadedModel("m.onnx", m, 17, [TensorInfo("x", "float32", ("batch", N)), TensorInfo("flag", "bool", ())],
                       [TensorInfo("y", "float32", ())])


def _types(g: onnx.GraphProto) -> dict[str, list[int]]:
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*g.value_info, *g.output] if v.type.tensor_type.HasField("shape")}


def test_types_match_inference_with_the_weights_and_the_weights_stay():
    m = _model()
    reference = onnx.shape_inference.infer_shapes(_bound(m), data_prop=True)
    out = infer_shapes(_loaded(m), {"x": (4, N), "flag": ()})
    assert _types(out.graph) == _types(reference.graph)
    assert _types(out.graph)["r"] == [2, 2, N] and _types(out.graph)["y"] == [2, 2, N]
    then = out.graph.node[2].attribute[0].g if out.graph.node[2].attribute[0].name == "then_branch" \
        else out.graph.node[2].attribute[1].g
    assert _types(then)["then_out"] == [2, 2, N]
    assert [i.name for i in out.graph.input] == ["x", "flag"] and out.producer_name == "test"
    assert {i.name for i in out.graph.initializer} == {"w", "target"}
    assert out.graph.initializer[0].SerializeToString() == m.graph.initializer[0].SerializeToString()


def test_without_weights_lists_them_as_inputs():
    m = _model()
    out = infer_shapes(_loaded(m), {"x": (4, N), "flag": ()}, keep_weights=False)
    assert [i.name for i in out.graph.initializer] == ["target"]
    assert [i.name for i in out.graph.input] == ["x", "flag", "w"]
    assert _types(out.graph)["h"] == [4, N]
    assert without_large_constants(out) is out             # nothing large left: no copy
    assert N * N > SMALL_CONSTANT


def _bound(m: onnx.ModelProto) -> onnx.ModelProto:
    b = onnx.ModelProto()
    b.CopyFrom(m)
    b.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 4
    return b
