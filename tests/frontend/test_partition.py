"""Partial offload: which nodes stay in ONNX Runtime, and parts that never form a cycle."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from packager.frontend import LoadedModel, TensorInfo
from packager.frontend.partition import partition, part_model, tensor_types

F = TensorProto.FLOAT


def loaded(nodes, inputs, outputs, inits=(), opset=17) -> LoadedModel:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
                          [helper.make_tensor_value_info(n, F, None) for n in outputs], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return LoadedModel(None, m, opset, [TensorInfo(n, "float32", tuple(s)) for n, s in inputs.items()],
                       [TensorInfo(n, "float32", ()) for n in outputs])


def split(model, **keep):
    types = [tensor_types(model, {i.name: i.shape for i in model.inputs})]
    return partition(model, types, keep.get("ops", ()), keep.get("nodes", ())), types


def names(model, ks):
    return [model.proto.graph.node[k].name for k in ks]


def test_whole_model_is_one_part():
    m = loaded([helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("Neg", ["a"], ["y"], name="n")],
               {"x": [2, 3]}, ["y"])
    p, _ = split(m)
    assert p.whole and names(m, p.parts[0].nodes) == ["r", "n"]


def test_diamond_through_a_kept_node_is_split_without_a_cycle():
    # a -> b(kept) -> d and a -> c -> d: {a, c, d} in one part would need b's output inside and
    # would feed b from inside: a cycle. The parts must be {a(, c)} and {d}.
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Sigmoid", ["a"], ["b"], name="b"),
             helper.make_node("Neg", ["a"], ["c"], name="c"),
             helper.make_node("Add", ["b", "c"], ["y"], name="d")]
    m = loaded(nodes, {"x": [4]}, ["y"])
    p, _ = split(m, nodes=["b"])
    assert names(m, p.kept) == ["b"]
    groups = [set(names(m, part.nodes)) for part in p.parts]
    assert {"a", "c"} in groups and {"d"} in groups
    for part in p.parts:
        if "d" in names(m, part.nodes):
            assert set(part.inputs) == {"b", "c"}


def test_keep_ops_and_unsupported_ops_stay_in_ort_with_reasons():
    k = numpy_helper.from_array(np.array([2], np.int64), "k")
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Hardmax", ["a"], ["v"], name="hardmax", axis=1),
             helper.make_node("Softmax", ["v"], ["s"], name="softmax", axis=1),
             helper.make_node("Neg", ["s"], ["y"], name="neg")]
    m = loaded(nodes, {"x": [3, 5]}, ["y"], [k])
    p, _ = split(m, ops=["Softmax"])
    assert names(m, p.kept) == ["hardmax", "softmax"]
    assert p.reasons[1] == "operator not supported by the packager"
    assert p.reasons[2] == "listed in onnxruntime.keep_ops"
    assert [names(m, part.nodes) for part in p.parts] == [["relu"], ["neg"]]


def test_shape_operand_from_a_kept_node_keeps_its_consumer():
    # Shape of a kept node's output is fine (static), but its *values* as a Reshape shape are not.
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Abs", ["shape_src"], ["shape_vals"], name="abs_kept"),
             helper.make_node("Cast", ["shape_vals"], ["shape_i"], name="cast", to=TensorProto.INT64),
             helper.make_node("Reshape", ["a", "shape_i"], ["y"], name="reshape")]
    m = loaded(nodes, {"x": [2, 6], "shape_src": [2]}, ["y"])
    p, _ = split(m, nodes=["abs_kept"])
    assert "reshape" in names(m, p.kept)
    assert "only known at run time" in p.reasons[3] or "no static shape" in p.reasons[3]


def test_part_model_is_a_valid_standalone_model():
    k = numpy_helper.from_array(np.array([2], np.int64), "k")
    w = numpy_helper.from_array(np.ones((5, 4), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
             helper.make_node("Hardmax", ["a"], ["v"], name="hardmax", axis=1),
             helper.make_node("Relu", ["v"], ["y"], name="relu")]
    m = loaded(nodes, {"x": [3, 5]}, ["y"], [k, w])
    p, types = split(m)
    first = part_model(m, p.parts[0], types)
    onnx.checker.check_model(first, full_check=True)
    assert [i.name for i in first.graph.input] == ["x"] and [o.name for o in first.graph.output] == ["a"]
    assert [i.name for i in first.graph.initializer] == ["w"]


def test_tensors_and_weights_read_only_inside_a_subgraph_stay_available():
    """An If branch reading a compiled part's tensor and an outer weight: the part exports the tensor
    and ort/model.onnx keeps the weight (silero VAD's decoder)."""
    from packager.emit.ort_wrapper import PackagedNode, wrapper_model

    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    then_g = helper.make_graph([helper.make_node("Add", ["a", "w"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F, [4])])
    else_g = helper.make_graph([helper.make_node("Identity", ["b"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, [4])])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Neg", ["a"], ["b"], name="neg"),
             helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)]
    zero = numpy_helper.from_array(np.zeros((), np.float32), "zero")
    m = loaded(nodes, {"x": [4]}, ["y"], inits=[w, zero])
    m.proto.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", F, [4]))
    p, types = split(m)
    assert names(m, p.kept) == ["if"]
    assert {"a", "b", "c"} <= {o for part in p.parts for o in part.outputs}
    packaged = [PackagedNode(f"packaged_{q.name}", f"../parts/{q.name}", "id", "0" * 64, q.inputs, q.outputs) for q in p.parts]
    wrapper = wrapper_model(m.proto, packaged, [m.proto.graph.node[k] for k in p.kept], [])
    assert "w" in {i.name for i in wrapper.graph.initializer}
    onnx.checker.check_model(wrapper)


def test_shape_inference_leaves_no_files_in_the_working_directory(tmp_path, monkeypatch):
    """onnxruntime's symbolic inference saves sym_shape_infer_temp.onnx into the cwd when a shape
    stays unknown (here: the output of a custom-domain op it does not know)."""
    m = loaded([helper.make_node("Foo", ["x"], ["a"], name="foo", domain="my.ops"),
                helper.make_node("Relu", ["a"], ["y"], name="relu")], {"x": [4, 4]}, ["y"])
    m.proto.opset_import.append(helper.make_opsetid("my.ops", 1))
    monkeypatch.chdir(tmp_path)
    tensor_types(m, {"x": (4, 4)})
    assert list(tmp_path.iterdir()) == []


def _nested_ifs(depth: int) -> LoadedModel:
    """`depth` Ifs, each in the then-branch of the one before, on a runtime condition."""
    def body(d: int, tag: str) -> onnx.GraphProto:
        out = helper.make_tensor_value_info(f"o{tag}", F, [4])
        if d == 0:
            return helper.make_graph([helper.make_node("Add", ["a", "a"], [f"o{tag}"])], f"g{tag}", [], [out])
        node = helper.make_node("If", ["c"], [f"o{tag}"], then_branch=body(d - 1, tag + "t"),
                                else_branch=body(0, tag + "e"))
        return helper.make_graph([node], f"g{tag}", [], [out])

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=body(depth - 1, "t"),
                              else_branch=body(0, "e"))]
    return loaded(nodes, {"x": [4]}, ["y"], inits=[numpy_helper.from_array(np.zeros((), np.float32), "zero")])


def test_deeply_nested_ifs_keep_onnx_shape_inference(monkeypatch):
    """ONNX Runtime's symbolic inference doubles its time per nesting level: 25 nested Ifs never
    reach it (they stay in ONNX Runtime, shapes from ONNX's own inference); 3 still do."""
    from onnxruntime.tools import symbolic_shape_infer
    from packager.frontend.partition import MAX_NESTING, nesting

    calls = []
    real = symbolic_shape_infer.SymbolicShapeInference.infer_shapes
    monkeypatch.setattr(symbolic_shape_infer.SymbolicShapeInference, "infer_shapes",
                        staticmethod(lambda *a, **k: calls.append(1) or real(*a, **k)))
    deep, shallow = _nested_ifs(25), _nested_ifs(3)
    assert nesting(deep.proto.graph) == 25 > MAX_NESTING >= nesting(shallow.proto.graph) == 3
    types = tensor_types(deep, {"x": (4,)})
    assert not calls and types["a"] == ("float32", (4,))
    p, _ = split(deep)
    assert names(deep, p.kept) == ["if"]
    tensor_types(shallow, {"x": (4,)})
    assert calls


def test_resize_interpolating_integers_stays_in_onnxruntime():
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [helper.make_node("Cast", ["x"], ["q"], name="cast", to=TensorProto.UINT8),
             helper.make_node("Resize", ["q", "", "scales"], ["r"], name="resize", mode="linear"),
             helper.make_node("Cast", ["r"], ["y"], name="back", to=TensorProto.FLOAT)]
    m = loaded(nodes, {"x": [1, 1, 4, 4]}, ["y"], [scales])
    p, _ = split(m)
    assert names(m, p.kept) == ["resize"] and "interpolates integers" in p.reasons[1]
