"""LSTM/GRU/RNN unrolled into primitive ops mean what onnxruntime (ONNX's reference evaluator for
layout=1, which onnxruntime does not run) computes for the original node:
every direction, layout, initial states, peepholes, linear_before_reset and every output."""
from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from packager.frontend.model import unsupported_configuration
from packager.frontend.rewrites import rewrite
from support.helpers import ort_run

SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 6
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def recurrent_model(op: str, direction: str, layout: int, initial: bool, extra: dict | None = None,
                    opset: int = 14):
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    rng = np.random.default_rng(hash((op, direction, layout, initial)) % 2**32)
    inits = [nh.from_array(rng.standard_normal((dirs, g * HIDDEN, INPUT)).astype(np.float32) * 0.5, "W"),
             nh.from_array(rng.standard_normal((dirs, g * HIDDEN, HIDDEN)).astype(np.float32) * 0.5, "R"),
             nh.from_array(rng.standard_normal((dirs, 2 * g * HIDDEN)).astype(np.float32) * 0.5, "B")]
    ins = ["X", "W", "R", "B", "", "", ""]
    x_shape = [SEQ, BATCH, INPUT] if layout == 0 else [BATCH, SEQ, INPUT]
    state_shape = [dirs, BATCH, HIDDEN] if layout == 0 else [BATCH, dirs, HIDDEN]
    graph_inputs = [helper.make_tensor_value_info("X", T.FLOAT, x_shape)]
    if initial:
        ins[5] = "h0"
        graph_inputs.append(helper.make_tensor_value_info("h0", T.FLOAT, state_shape))
        if op == "LSTM":
            ins[6] = "c0"
            graph_inputs.append(helper.make_tensor_value_info("c0", T.FLOAT, state_shape))
    if op == "LSTM":
        inits.append(nh.from_array(rng.standard_normal((dirs, 3 * HIDDEN)).astype(np.float32) * 0.5, "P"))
        ins.append("P")
    while not ins[-1]:
        ins.pop()
    outs = ["Y", "Y_h", "Y_c"][:3 if op == "LSTM" else 2]
    layout_attr = {"layout": layout} if opset >= 14 else {}          # the attribute is new in opset 14
    node = helper.make_node(op, ins, outs, hidden_size=HIDDEN, direction=direction, **layout_attr, **(extra or {}))
    y_shape = [SEQ, dirs, BATCH, HIDDEN] if layout == 0 else [BATCH, SEQ, dirs, HIDDEN]
    graph_outputs = [helper.make_tensor_value_info("Y", T.FLOAT, y_shape)] + [
        helper.make_tensor_value_info(o, T.FLOAT, state_shape) for o in outs[1:]]
    m = helper.make_model(helper.make_graph([node], "g", graph_inputs, graph_outputs, inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _attr(node, name):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)


def _same_results(model: onnx.ModelProto, tmp_path):
    feeds = {v.name: np.random.default_rng(3).standard_normal(
        [d.dim_value for d in v.type.tensor_type.shape.dim]).astype(np.float32) for v in model.graph.input}
    unrolled, changed = rewrite(onnx.shape_inference.infer_shapes(model))
    assert changed >= 1 and model.graph.node[0].op_type not in {n.op_type for n in unrolled.graph.node}
    onnx.save(unrolled, str(tmp_path / "unrolled.onnx"))
    got = ort_run(tmp_path / "unrolled.onnx", feeds)
    if _attr(model.graph.node[0], "layout"):       # onnxruntime has no batch-major recurrent kernels
        want = dict(zip([o.name for o in model.graph.output], ReferenceEvaluator(model).run(None, feeds)))
    else:
        onnx.save(model, str(tmp_path / "orig.onnx"))
        want = ort_run(tmp_path / "orig.onnx", feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("op,direction,layout,initial", [
    (op, d, lay, init) for op, d, (lay, init) in itertools.product(
        ("LSTM", "GRU", "RNN"), ("forward", "reverse", "bidirectional"), ((0, False), (1, True)))])
def test_unrolled_matches_onnxruntime(tmp_path, op, direction, layout, initial):
    model = recurrent_model(op, direction, layout, initial)
    model.graph.node[0].name = "rnn0"
    _same_results(model, tmp_path)


@pytest.mark.parametrize("op,extra", [
    ("GRU", {"linear_before_reset": 1}), ("LSTM", {"input_forget": 1}), ("LSTM", {"clip": 0.5}),
    ("RNN", {"activations": ["Relu"]}), ("LSTM", {"activations": ["HardSigmoid", "Tanh", "Tanh"],
                                                  "activation_alpha": [0.3], "activation_beta": [0.4]})])
def test_variants_match_onnxruntime(tmp_path, op, extra):
    _same_results(recurrent_model(op, "forward", 0, True, extra), tmp_path)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_unrolled_in_an_opset_12_model(tmp_path, op):
    """Before opset 13 Unsqueeze/Split take axes/sizes as attributes (ddddocr's LSTM, opset 12)."""
    _same_results(recurrent_model(op, "bidirectional", 0, True, opset=12), tmp_path)


def test_variable_lengths_and_unknown_activations_stay_in_onnxruntime():
    lens = helper.make_node("LSTM", ["X", "W", "R", "B", "lens"], ["Y"], hidden_size=2)
    assert "sequence_lens" in unsupported_configuration(lens)
    odd = helper.make_node("RNN", ["X", "W", "R"], ["Y"], hidden_size=2, activations=["ScaledTanh"])
    assert "ScaledTanh" in unsupported_configuration(odd)
    assert unsupported_configuration(helper.make_node("GRU", ["X", "W", "R"], ["Y"], hidden_size=2)) is None
