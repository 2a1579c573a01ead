"""LSTM/GRU/RNN lowered to a projection and a loop kernel per direction, imported into Relax and
compiled, mean what onnxruntime (ONNX's reference evaluator for layout=1, which onnxruntime does
not run) computes for the original node: every direction, layout, initial states, peepholes,
clip, linear_before_reset and every output; and the lowered graph does not grow with the sequence."""
from __future__ import annotations

import itertools
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh
import tvm
from onnx.reference import ReferenceEvaluator
from tvm import relax

from packager.frontend.model import unsupported_configuration
from packager.frontend.recurrent import OP_TYPE
from packager.frontend.relax_import import _importer_patched
from packager.frontend.rewrites import rewrite
from support.helpers import ort_run

SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 6
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def recurrent_model(op: str, direction: str, layout: int, initial: bool, extra: dict | None = None,
                    opset: int = 14):
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    rng = np.random.default_rng(zlib.crc32(f"{op}{direction}{layout}{initial}".encode()))
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


def _lowered(model: onnx.ModelProto) -> onnx.ModelProto:
    lowered, changed = rewrite(onnx.shape_inference.infer_shapes(model))
    assert changed >= 1 and model.graph.node[0].op_type not in {n.op_type for n in lowered.graph.node}
    return lowered


def _compiled_run(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    """The lowered model through the importer (our operators known) and TVM's default build."""
    from tvm.relax.frontend.onnx import from_onnx
    with _importer_patched():
        mod = from_onnx(_lowered(model), keep_params_in_input=False)
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in model.graph.input])
    got = [got] if isinstance(got, tvm.runtime.Tensor) else list(got)
    return {o.name: g.numpy() for o, g in zip(model.graph.output, got)}


def _same_results(model: onnx.ModelProto, tmp_path, atol: float = 1e-6):
    feeds = {v.name: np.random.default_rng(3).standard_normal(
        [d.dim_value for d in v.type.tensor_type.shape.dim]).astype(np.float32) for v in model.graph.input}
    got = _compiled_run(model, feeds)
    if _attr(model.graph.node[0], "layout") and _attr(model.graph.node[0], "clip") is None:
        # onnxruntime has no batch-major recurrent kernels (the reference evaluator ignores clip)
        want = dict(zip([o.name for o in model.graph.output], ReferenceEvaluator(model).run(None, feeds)))
    else:
        onnx.save(model, str(tmp_path / "orig.onnx"))
        want = ort_run(tmp_path / "orig.onnx", feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=atol, err_msg=name)


@pytest.mark.parametrize("op,direction,layout,initial", [
    (op, d, lay, init) for op, d, (lay, init) in itertools.product(
        ("LSTM", "GRU", "RNN"), ("forward", "reverse", "bidirectional"), ((0, False), (1, True)))])
def test_lowered_matches_onnxruntime(tmp_path, op, direction, layout, initial):
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
def test_lowered_in_an_opset_12_model(tmp_path, op):
    """Before opset 13 Unsqueeze/Split take axes/sizes as attributes (ddddocr's LSTM, opset 12)."""
    _same_results(recurrent_model(op, "bidirectional", 0, True, opset=12), tmp_path)


def test_the_lowered_graph_does_not_grow_with_the_sequence():
    """One loop node per direction whatever the length: 5 steps and 2000 steps lower alike."""
    counts = []
    for seq in (SEQ, 2000):
        m = recurrent_model("GRU", "bidirectional", 0, True)
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = seq
        m.graph.output[0].type.tensor_type.shape.dim[0].dim_value = seq
        lowered = _lowered(m)
        assert sum(n.op_type == OP_TYPE for n in lowered.graph.node) == 2
        counts.append(len(lowered.graph.node))
    assert counts[0] == counts[1]


def test_a_sequence_longer_than_unrolling_allowed_matches_onnxruntime(tmp_path):
    """600 steps (unrolling stopped at 512); float32 rounding of tanh/sigmoid accumulates over them."""
    m = recurrent_model("LSTM", "reverse", 0, True)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 600
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 600
    _same_results(m, tmp_path, atol=1e-4)


def test_variable_lengths_and_unknown_activations_stay_in_onnxruntime():
    lens = helper.make_node("LSTM", ["X", "W", "R", "B", "lens"], ["Y"], hidden_size=2)
    assert "sequence_lens" in unsupported_configuration(lens)
    odd = helper.make_node("RNN", ["X", "W", "R"], ["Y"], hidden_size=2, activations=["ScaledTanh"])
    assert "ScaledTanh" in unsupported_configuration(odd)
    assert unsupported_configuration(helper.make_node("GRU", ["X", "W", "R"], ["Y"], hidden_size=2)) is None
