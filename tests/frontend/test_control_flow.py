"""If/Loop that the profiles make static are inlined/unrolled (frontend/control_flow.py) and compute
what onnxruntime computes on the original; the others stay, each with its reason."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper as h, numpy_helper

from support.helpers import run_pack, save_model, write_spec
from packager.frontend.control_flow import LOOP_MAX_UNROLL, inline_control_flow
from packager.frontend.model import load_model


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    m = h.make_model(h.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _branch(name: str, nodes, out: str, inits=()) -> onnx.GraphProto:
    return h.make_graph(nodes, name, [], [h.make_tensor_value_info(out, T.FLOAT, None)], list(inits))


def _if_on_batch(extra_then=()) -> onnx.ModelProto:
    """y = 2 relu(x) when x's batch is 1, else -x (an exporter's `if x.shape[0] == 1`)."""
    then = _branch("then", [h.make_node("Relu", ["x"], ["t"]), *extra_then,
                            h.make_node("Mul", ["t", "two"], ["y_then"])], "y_then",
                   [numpy_helper.from_array(np.float32([2]), "two")])
    other = _branch("else", [h.make_node("Neg", ["x"], ["y_else"])], "y_else")
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             h.make_node("Equal", ["b", "one"], ["c"]),
             h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if0")]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 4])], [h.make_tensor_value_info("y", T.FLOAT, ["N", 4])],
                  [numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "one")])


def _loop(trips: int, opset: int = 17, cond_from_body: bool = False) -> onnx.ModelProto:
    """acc <- (acc + x) * i for i < trips, scanning sin(acc) each step."""
    body_cond = [h.make_node("Less", ["i", "limit"], ["cond_out"])] if cond_from_body else \
        [h.make_node("Identity", ["cond_in"], ["cond_out"])]
    body = h.make_graph(body_cond + [
        h.make_node("Cast", ["i"], ["fi"], to=T.FLOAT), h.make_node("Add", ["acc_in", "x"], ["a1"]),
        h.make_node("Mul", ["a1", "fi"], ["acc_out"]), h.make_node("Sin", ["acc_out"], ["scan_out"])], "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("acc_in", T.FLOAT, None)],
        [h.make_tensor_value_info(n, t, None) for n, t in (("cond_out", T.BOOL), ("acc_out", T.FLOAT), ("scan_out", T.FLOAT))])
    inputs = [h.make_tensor_value_info("x", T.FLOAT, [2, 3]), h.make_tensor_value_info("x0", T.FLOAT, [2, 3])]
    return _model([h.make_node("Loop", ["M", "", "x0"], ["acc", "scans"], body=body, name="loop0")], inputs,
                  [h.make_tensor_value_info("acc", T.FLOAT, [2, 3]), h.make_tensor_value_info("scans", T.FLOAT, [trips, 2, 3])],
                  [numpy_helper.from_array(np.array(trips, np.int64), "M"),
                   numpy_helper.from_array(np.array(3, np.int64), "limit")], opset)


def _flatten(tmp_path, model, profiles):
    path = save_model(model, tmp_path / "m.onnx")
    return inline_control_flow(load_model(path), profiles)


def _same(original: onnx.ModelProto, flat: onnx.ModelProto, feeds: dict) -> None:
    onnx.checker.check_model(flat, full_check=True)
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(run(original), run(flat)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("batch,branch", [(1, "Relu"), (3, "Neg")])
def test_if_on_a_shape_takes_the_branch_the_profile_picks(tmp_path, batch, branch):
    m = _if_on_batch()
    flat = _flatten(tmp_path, m, [{"x": (batch, 4)}])
    assert flat.inlined == {"If": 1} and not flat.kept
    ops = [n.op_type for n in flat.proto.graph.node]
    assert "If" not in ops and branch in ops and "Shape" not in ops        # the condition's nodes are gone too
    _same(m, flat.proto, {"x": np.random.default_rng(0).standard_normal((batch, 4)).astype(np.float32)})


def test_if_on_data_or_on_a_shape_that_differs_between_profiles_stays(tmp_path):
    flat = _flatten(tmp_path, _if_on_batch(), [{"x": (1, 4)}, {"x": (2, 4)}])
    assert not flat.inlined and "differs between profiles" in flat.kept["if0 (If)"]
    m = _if_on_batch()
    m.graph.node[2].input[0] = "x_flag"                   # the condition now reads input data
    m.graph.node[2].op_type = "Identity"
    del m.graph.node[2].input[1:]
    m.graph.input.append(h.make_tensor_value_info("x_flag", T.BOOL, []))
    flat = _flatten(tmp_path, m, [{"x": (1, 4), "x_flag": ()}])
    assert not flat.inlined and "computed from input data" in flat.kept["if0 (If)"]


def _then(model: onnx.ModelProto, k: int = 3) -> onnx.GraphProto:
    return next(a.g for a in model.graph.node[k].attribute if a.name == "then_branch")


def test_inlined_names_stay_unique_and_nested_ifs_inline_too(tmp_path):
    """Two sibling Ifs whose branches define the same names, the second holding a nested If."""
    m = _if_on_batch()
    second = _if_on_batch().graph.node[3]
    second.name, second.output[0] = "if1", "y1"
    nested = _if_on_batch().graph.node[3]
    nested.name, nested.output[0] = "nested", "n_y"
    for a in nested.attribute:                           # the nested branches' names differ from their parents'
        for n in a.g.node:
            n.output[:] = [f"n_{o}" for o in n.output]
            n.input[:] = [f"n_{i}" if i in ("t", "two") else i for i in n.input]
        a.g.output[0].name = f"n_{a.g.output[0].name}"
        for i in a.g.initializer:
            i.name = f"n_{i.name}"
    then = next(a.g for a in second.attribute if a.name == "then_branch")
    then.node.insert(1, nested)
    then.node.insert(2, h.make_node("Add", ["n_y", "t"], ["t2"]))
    then.node[-1].input[0] = "t2"
    m.graph.node.append(second)
    m.graph.node.append(h.make_node("Add", ["y", "y1"], ["z"]))
    m.graph.output[0].name = "z"
    flat = _flatten(tmp_path, m, [{"x": (1, 4)}])
    assert flat.inlined == {"If": 3}
    defined = [o for n in flat.proto.graph.node for o in n.output] + [i.name for i in flat.proto.graph.initializer]
    assert len(defined) == len(set(defined))
    _same(m, flat.proto, {"x": np.random.default_rng(1).standard_normal((1, 4)).astype(np.float32)})


@pytest.mark.parametrize("opset", [11, 17])            # Unsqueeze's axes: attribute before 13, input after
def test_loop_with_a_static_trip_count_unrolls(tmp_path, opset):
    m = _loop(5, opset)
    flat = _flatten(tmp_path, m, [{"x": (2, 3), "x0": (2, 3)}])
    assert flat.inlined == {"Loop": 1}
    ops = [n.op_type for n in flat.proto.graph.node]
    assert "Loop" not in ops and ops.count("Sin") == 5
    rng = np.random.default_rng(2)
    _same(m, flat.proto, {k: rng.standard_normal((2, 3)).astype(np.float32) for k in ("x", "x0")})


@pytest.mark.parametrize("model,why", [
    (lambda: _loop(4, cond_from_body=True), "computes the loop condition"),
    (lambda: _loop(LOOP_MAX_UNROLL + 1), f"<= {LOOP_MAX_UNROLL} iterations"),
    (lambda: _loop(0), "zero times"),
])
def test_loops_that_do_not_unroll_say_why(tmp_path, model, why):
    flat = _flatten(tmp_path, model(), [{"x": (2, 3), "x0": (2, 3)}])
    assert not flat.inlined and why in flat.kept["loop0 (Loop)"]


@pytest.mark.slow
def test_build_compiles_static_control_flow_and_verify_checks_inside_it(tmp_path):
    """End to end: the If is inlined, the branch's Hardmax stays in ONNX Runtime, so part boundaries
    run through tensors that exist only in the inlined model; verify checks them all."""
    model = _if_on_batch(extra_then=[h.make_node("Hardmax", ["t"], ["hm"], axis=1),
                                     h.make_node("Add", ["hm", "t"], ["t3"])])
    _then(model).node[-1].input[0] = "t3"
    save_model(model, tmp_path / "model.onnx")
    spec = write_spec(tmp_path, "name: cf\nmodel: model.onnx\ninputs:\n  x: {shape: [1, 4]}\ntargets: [x86-64]\n")
    r = run_pack("build", spec)
    assert r.returncode == 0, r.stderr
    assert "inlined If x1" in r.stdout and "Hardmax" in r.stdout
    r = run_pack("verify", tmp_path / "dist" / "cf")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[p0]" in r.stdout and " t: max abs err 0," in r.stdout      # 't' exists only inside the branch
    report = json.loads((tmp_path / "dist" / "cf" / "build_report.json").read_text())
    assert report["frontend"]["control_flow"]["inlined"] == {"If": 1}


@pytest.mark.slow
def test_strict_build_compiles_a_model_whose_loop_unrolls(tmp_path):
    """fallback: false: the Loop would be an error if it were not unrolled."""
    save_model(_loop(4), tmp_path / "model.onnx")
    spec = write_spec(tmp_path, "name: loop\nmodel: model.onnx\ntargets: [x86-64]\nonnxruntime: {fallback: false}\n")
    r = run_pack("build", spec)
    assert r.returncode == 0, r.stderr
    assert "unrolled Loop x1" in r.stdout
    r = run_pack("verify", tmp_path / "dist" / "loop")
    assert r.returncode == 0, r.stdout + r.stderr
