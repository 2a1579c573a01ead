"""Fast math (optimize/fastmath.py): the legalized approximations agree with onnxruntime within a
few ulps on ordinary values, saturate correctly at +-inf and large magnitudes, keep NaN, and leave
the element-wise ops as graph ops until legalization (so layouts propagate through them)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper
from tvm import relax

from packager.frontend import import_relax, load_model
from packager.optimize.fastmath import LEGALIZATIONS, fastmath
from packager.optimize.relax_util import count_ops, legalize
from support.helpers import ort_run, save_model

F = TensorProto.FLOAT
OPS = ["Sigmoid", "Tanh", "Exp", "Erf"]


def _model(n: int) -> onnx.ModelProto:
    """Each function of x, SiLU (x * sigmoid x) and GELU (opset 20) as separate outputs."""
    nodes = [helper.make_node(op, ["x"], [op.lower()]) for op in OPS]
    nodes += [helper.make_node("Mul", ["x", "sigmoid"], ["silu"]),
              helper.make_node("Gelu", ["x"], ["gelu"]), helper.make_node("Gelu", ["x"], ["gelu_tanh"],
                                                                          approximate="tanh"),
              helper.make_node("Softmax", ["x"], ["softmax"], axis=-1)]
    outs = [op.lower() for op in OPS] + ["silu", "gelu", "gelu_tanh", "softmax"]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, n])],
                          [helper.make_tensor_value_info(o, F, [1, n]) for o in outs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 9
    return m


def _run(tmp_path, x: np.ndarray, fast: bool) -> tuple[dict, list[np.ndarray], tvm.IRModule]:
    path = save_model(_model(x.shape[1]), tmp_path / "m.onnx")
    want = ort_run(path, {"x": x})
    mod = import_relax(load_model(Path(path)), {"x": x.shape}, {"x": "float32"})
    mod = mod[0] if isinstance(mod, tuple) else mod
    graph = fastmath(mod)[0] if fast else mod
    lowered = legalize(graph, LEGALIZATIONS if fast else None)
    vm = relax.VirtualMachine(tvm.compile(lowered, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x))
    return want, [got[k].numpy() for k in range(len(want))], graph


def test_fast_functions_agree_with_onnxruntime_and_keep_special_values(tmp_path):
    rng = np.random.default_rng(0)
    ordinary = rng.normal(0, 4, 250).astype(np.float32)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 100.0], np.float32)
    x = np.concatenate([ordinary, special])[None]
    want, got, _ = _run(tmp_path, x, fast=True)
    for (name, w), g in zip(want.items(), got):
        scale = np.maximum(np.abs(w), 1e-30)
        finite = np.isfinite(w) & np.isfinite(x)
        if name == "exp":
            rel = np.abs(g[finite] - w[finite]) / scale[finite]
            assert rel.max() < 1e-5, name
        elif name != "softmax":
            assert np.abs(g[finite] - w[finite]).max() < 2e-5, name
            assert np.array_equal(np.isnan(g[0, :256]), np.isnan(w[0, :256])), name
    sig = got[list(want).index("sigmoid")][0, -6:]
    assert np.isnan(sig[0]) and sig[1] == 1.0 and sig[2] == 0.0 and sig[5] == 1.0
    tanh = got[list(want).index("tanh")][0, -6:]
    assert tanh[1] == 1.0 and tanh[2] == -1.0


def test_elementwise_ops_stay_graph_ops_until_legalization(tmp_path):
    x = np.linspace(-3, 3, 16, dtype=np.float32)[None]
    _, exact, before = _run(tmp_path, x, fast=False)
    _, fast, after = _run(tmp_path, x, fast=True)
    ops = count_ops(after)
    assert ops.get("relax.sigmoid") == 1 and ops.get("relax.tanh") == 1 and "relax.nn.softmax" not in ops
    assert count_ops(before).get("relax.nn.softmax") == 1
    for e, f in zip(exact, fast):
        np.testing.assert_allclose(f, e, rtol=1e-5, atol=2e-6)


def test_the_fast_legalization_has_no_libm_call():
    x = relax.Var("x", relax.TensorType((1, 64), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.sigmoid(x))
        bb.emit_func_output(y)
    mod = legalize(bb.get(), LEGALIZATIONS)
    text = mod.script()
    assert "T.exp(" not in text and "T.sigmoid(" not in text
    assert "T.sigmoid(" in legalize(bb.get()).script()
