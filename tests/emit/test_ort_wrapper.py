"""ort/model.onnx (emit/ort_wrapper.py): the source model's interface around PackagedModel nodes
and the nodes left to ONNX Runtime, ordered, with only the initializers ONNX Runtime's nodes read."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from packager.emit.ort_wrapper import DOMAIN, MAX_IR_VERSION, OP, PackagedNode, _toposort, wrapper_model

F = TensorProto.FLOAT


def _source() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"), helper.make_node("Add", ["a", "w"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [4])],
                          [helper.make_tensor_value_info("y", F, [4])],
                          [numpy_helper.from_array(np.ones(4, np.float32), "w"),
                           numpy_helper.from_array(np.ones(4, np.float32), "unused")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 11
    return m


def test_a_part_and_a_kept_node_make_a_valid_model():
    src = _source()
    part = PackagedNode("packaged_p0", "../parts/p0", "0123456789abcdef", "f" * 64, ["x"], ["a"])
    out = wrapper_model(src, [part], [src.graph.node[1]], [helper.make_tensor_value_info("a", F, [4])])
    onnx.checker.check_model(out)
    packaged, kept = out.graph.node
    assert (packaged.domain, packaged.op_type, kept.name) == (DOMAIN, OP, "add")
    attrs = {a.name: helper.get_attribute_value(a) for a in packaged.attribute}
    assert attrs == {"package": b"../parts/p0", "package_id": b"0123456789abcdef", "package_sha256": b"f" * 64}
    assert [i.name for i in out.graph.initializer] == ["w"]            # only what ONNX Runtime's nodes read
    assert out.ir_version == MAX_IR_VERSION and {o.domain for o in out.opset_import} == {"", DOMAIN}


def test_nodes_are_ordered_by_their_inputs_and_a_cycle_is_named():
    b = helper.make_node("Neg", ["a"], ["b"], name="second")
    a = helper.make_node("Relu", ["x"], ["a"], name="first")
    assert [n.name for n in _toposort([b, a], {"x"})] == ["first", "second"]
    with pytest.raises(ValueError, match="cannot order nodes .*second"):
        _toposort([b], {"x"})
