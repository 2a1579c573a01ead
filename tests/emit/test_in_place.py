"""Concats assembled in place (emit/in_place.py): which kernels are concatenations, which concats
qualify, the plan's assemble steps and offsets, and packages that compute what onnxruntime does
with the pass on and off, the runtime refusing an assembly whose parts do not tile its output."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import te, topi

from packager.emit.in_place import concat_axis
from support.helpers import save_model, write_spec
from support.packrt import cli, one_line_error, run
from support.resign import resign


def _func(*shapes, axis=1, order=None):
    ins = [te.placeholder(s, name=f"x{i}") for i, s in enumerate(shapes)]
    picked = [ins[i] for i in (order or range(len(ins)))]
    return te.create_prim_func([*ins, topi.concatenate(picked, axis=axis)])


def test_concat_axis_reads_concatenations_from_the_tir():
    assert concat_axis(_func((1, 16, 13, 13, 8), (1, 8, 13, 13, 8), (1, 8, 13, 13, 8))) == 1
    assert concat_axis(_func((1, 5, 7), (1, 5, 3), axis=2)) == 2
    assert concat_axis(_func((2, 4), (3, 4), axis=0)) == 0


def test_kernels_that_are_not_concatenations_in_parameter_order_are_refused():
    # the inputs concatenated in the other order than the kernel takes them
    assert concat_axis(_func((1, 8, 4), (1, 8, 4), order=[1, 0])) is None
    assert concat_axis(_func((1, 16, 4), (1, 8, 4), order=[1, 0])) is None
    a = te.placeholder((1, 8), name="a")
    assert concat_axis(te.create_prim_func([a, a, topi.add(a, a)])) is None
    assert concat_axis(te.create_prim_func([a, topi.concatenate([a, a], axis=1)])) is None


def _conv(name, x, cin, cout, k, rng):
    w = numpy_helper.from_array((rng.standard_normal((cout, cin, k, k)) * 0.2).astype(np.float32), f"{name}_w")
    node = helper.make_node("Conv", [x, w.name], [name], kernel_shape=[k, k], pads=[k // 2] * 4)
    return node, w


def _model(hw: int, extra_output: bool = False) -> onnx.ModelProto:
    """x -> relu(conv 1x1) a, conv 3x3 b; c1 = concat(a, b); c = conv(c1); c2 = concat(c1, c);
    y = conv(c2) (+ concat(x, x) and `a` itself as outputs when `extra_output`)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for name, x, cin, cout, k in (("a0", "x", 8, 16, 1), ("b", "x", 8, 8, 3)):
        n, w = _conv(name, x, cin, cout, k, rng)
        nodes.append(n)
        inits.append(w)
    nodes.append(helper.make_node("Relu", ["a0"], ["a"]))
    nodes.append(helper.make_node("Concat", ["a", "b"], ["c1"], axis=1))
    n, w = _conv("c", "c1", 24, 8, 1, rng)
    nodes.append(n)
    inits.append(w)
    nodes.append(helper.make_node("Concat", ["c1", "c"], ["c2"], axis=1))
    n, w = _conv("y", "c2", 32, 4, 3, rng)
    nodes.append(n)
    inits.append(w)
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, hw, hw])]
    if extra_output:
        nodes.append(helper.make_node("Concat", ["x", "x"], ["xx"], axis=1))
        outs += [helper.make_tensor_value_info("xx", TensorProto.FLOAT, [1, 16, hw, hw]),
                 helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 16, hw, hw])]
    graph = helper.make_graph(nodes, "concats", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, hw, hw])],
                              outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _build(tmp_path, name: str, model: onnx.ModelProto, hw: int, on: bool = True):
    from packager.build import build
    from packager.spec import load_spec

    folder = tmp_path / name
    save_model(model, folder / "model.onnx")
    spec = write_spec(folder, f"""\
name: {name}
model: model.onnx
inputs:
  x: {{dtype: float32, shape: [1, 8, {hw}, {hw}]}}
targets: [x86-64]
optimize:
  level: 1
  passes: {{concat_in_place: {str(on).lower()}}}
  tuning: {{measure: false}}
verify: {{rtol: 1.0e-4, atol: 1.0e-5}}
""")
    pkg = build(load_spec(spec), log=lambda _m: None)
    plan = json.loads((pkg / "targets" / "x86-64" / "plan.json").read_text())
    report = json.loads((pkg / "build_report.json").read_text())
    line = next(p for p in report["targets"][0]["kernel_passes"] if p["pass"] == "concat_in_place")
    return pkg, plan["profiles"][0], line


def _assemblies(prof: dict) -> list[dict]:
    return [s for s in prof["steps"] if s["op"] == "assemble"]


@pytest.mark.slow
def test_nested_concats_are_written_in_place_and_match_onnxruntime(tmp_path):
    """Both concats of the chain become assemble steps: every part lies end to end inside its
    whole, the first concat's output inside the second's; the package matches onnxruntime with
    the pass on and off, and the off build keeps its concat kernels."""
    pkg, prof, line = _build(tmp_path, "in_place", _model(8), 8)
    steps = _assemblies(prof)
    assert len(steps) == 2 and line["status"] == "applied" and "default 2" in line["summary"]
    for s in steps:
        *parts, whole = s["args"]
        at = prof["tensors"][whole]["offset"]
        for p in parts:
            assert prof["tensors"][p]["offset"] == at
            at += prof["tensors"][p]["bytes"]
        assert at == prof["tensors"][whole]["offset"] + prof["tensors"][whole]["bytes"]
    assert steps[0]["args"][-1] in steps[1]["args"][:-1]            # c1 is a part of c2
    assert run([*cli(pkg), pkg, "--check"]).returncode == 0

    off, prof_off, line_off = _build(tmp_path, "copies", _model(8), 8, on=False)
    assert not _assemblies(prof_off) and line_off["status"] == "disabled"
    assert len(prof_off["steps"]) == len(prof["steps"])
    assert run([*cli(off), off, "--check"]).returncode == 0


@pytest.mark.slow
def test_concats_that_cannot_live_in_place_stay_kernels(tmp_path):
    """A part that is a model output (`a`), a tensor concatenated with itself and a model input
    (`x`) keep their concat kernels. With 5x5 maps c1 = concat(a, b) puts b at 1600 bytes, but
    c2 = concat(c1, c) would put c at 2400, off the arena's 64-byte alignment: c2 stays a kernel."""
    pkg, prof, _ = _build(tmp_path, "outputs", _model(8, extra_output=True), 8)
    steps = _assemblies(prof)
    outputs = {o["tensor"] for o in prof["outputs"]}
    assert len(steps) == 1 and not set(steps[0]["args"]) & outputs      # only c2 = concat(c1, c)
    assert run([*cli(pkg), pkg, "--check"]).returncode == 0

    odd, prof_odd, line = _build(tmp_path, "odd", _model(5), 5)
    steps = _assemblies(prof_odd)
    assert len(steps) == 1 and "default 1" in line["summary"]
    assert [prof_odd["tensors"][t]["bytes"] for t in steps[0]["args"]] == [1600, 800, 2400]
    assert run([*cli(odd), odd, "--check"]).returncode == 0


@pytest.mark.slow
def test_the_runtime_refuses_parts_that_do_not_tile_their_whole(tmp_path):
    pkg, _, _ = _build(tmp_path, "tamper", _model(8), 8)
    path = pkg / "targets" / "x86-64" / "plan.json"
    plan = json.loads(path.read_text())
    prof = plan["profiles"][0]
    part = _assemblies(prof)[0]["args"][1]
    prof["tensors"][part]["offset"] += 64
    path.write_text(json.dumps(plan))
    resign(pkg, "targets/x86-64/plan.json")
    one_line_error(run([*cli(pkg), pkg, "--check"]), 2, "do not lie end to end")
