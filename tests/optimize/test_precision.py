"""Reduced precision (optimize/precision.py): convs and matmuls get fp16 operands with an fp32
accumulator, the keep list pins its ops to fp32, constant weights fold to fp16, TVM's global op
table is left as it was, and the fp16 module computes what the fp32 one does within fp16's
tolerance (run here on the CPU: LLVM computes fp16 too)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from packager.errors import UserError
from packager.frontend import import_relax, load_model
from packager.optimize.constfold import fold_constants
from packager.optimize.precision import to_precision
from packager.optimize.relax_util import is_const, legalize
from packager.spec.model import DEFAULT_KEEP_FP32, PRECISION_TOLERANCE
from packager.tools.verify import compare
from support.helpers import ort_run, save_model

F = TensorProto.FLOAT


def _model() -> onnx.ModelProto:
    """conv -> relu -> flatten -> matmul -> layer norm -> exp / softmax: compute ops, ops that
    follow, ops the keep list pins and an op TVM never converts."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.2, (8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.1, (8 * 16 * 16, 96)).astype(np.float32), "m"),
             numpy_helper.from_array(np.ones(96, np.float32), "g"), numpy_helper.from_array(np.zeros(96, np.float32), "b"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["f"]), helper.make_node("MatMul", ["f", "m"], ["y"]),
             helper.make_node("LayerNormalization", ["y", "g", "b"], ["n"], axis=-1),
             helper.make_node("Exp", ["n"], ["e"]), helper.make_node("Softmax", ["n"], ["s"], axis=-1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info(o, F, [1, 96]) for o in ("e", "s")], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def _imported(tmp_path) -> tuple[tvm.IRModule, dict, np.ndarray]:
    path = save_model(_model(), tmp_path / "m.onnx")
    x = np.random.default_rng(1).normal(0, 1, (1, 3, 16, 16)).astype(np.float32)
    mod = import_relax(load_model(Path(path)), {"x": x.shape}, {"x": "float32"})
    return (mod[0] if isinstance(mod, tuple) else mod), ort_run(path, {"x": x}), x


def _ops(mod: tvm.IRModule) -> dict[str, list[str]]:
    """Relax op -> dtypes of its first operand, per call."""
    out: dict[str, list[str]] = {}

    def visit(e) -> None:
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.args:
            first = e.args[1].fields[0] if e.op.name == "relax.call_tir" else e.args[0]
            out.setdefault(e.op.name, []).append(str(first.ty.dtype))

    relax.analysis.post_order_visit(mod["main"], visit)
    return out


def _run(mod: tvm.IRModule, x: np.ndarray) -> list[np.ndarray]:
    vm = relax.VirtualMachine(tvm.compile(legalize(fold_constants(mod)[0]), target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x))
    return [got.numpy()] if hasattr(got, "numpy") else [got[k].numpy() for k in range(len(got))]


def test_fp16_computes_what_fp32_does_within_the_fp16_tolerance(tmp_path):
    mod, want, x = _imported(tmp_path)
    half, report = to_precision(mod, "fp16", DEFAULT_KEEP_FP32)
    ops = _ops(half)
    assert ops["relax.nn.conv2d"] == ["float16"] and ops["relax.matmul"] == ["float16"]
    assert ops["relax.nn.layer_norm"] == ["float32"] and ops["relax.nn.softmax"] == ["float32"]
    assert report.details["fp16_compute_ops"] == 2 and report.details["fp32_compute_ops"] == 0
    assert "2 conv/matmul ops with fp16 operands and fp32 accumulation" in report.summary
    rtol, atol = PRECISION_TOLERANCE["fp16"]
    got = _run(half, x)
    for g, w in zip(got, want.values()):
        assert g.dtype == np.float32                       # the model's outputs keep their type
        max_abs, _, ok, _ = compare(g, w, rtol, atol)
        assert ok, max_abs
    exact = _run(mod, x)
    assert not all(np.array_equal(g, e) for g, e in zip(got, exact))   # fp16 really ran


def test_weights_fold_to_fp16_constants(tmp_path):
    mod, _, _ = _imported(tmp_path)
    folded = fold_constants(to_precision(mod, "fp16", DEFAULT_KEEP_FP32)[0])[0]
    consts = []
    relax.analysis.post_order_visit(folded["main"], lambda e: consts.append(e) if is_const(e) else None)
    dtypes = {str(c.value.numpy().dtype) for c in consts if c.value.numpy().size >= 8 * 27}
    assert dtypes == {"float16"}                           # conv and matmul weights, stored at half the bytes


def test_the_keep_list_decides_what_follows_in_fp16(tmp_path):
    mod, _, _ = _imported(tmp_path)
    free = _ops(to_precision(mod, "fp16", ())[0])
    assert free["relax.nn.layer_norm"] == ["float16"] and free["relax.exp"] == ["float16"]
    pinned = _ops(to_precision(mod, "fp16", ("LayerNormalization",))[0])
    assert pinned["relax.nn.layer_norm"] == ["float32"]


def test_tvms_op_table_is_restored(tmp_path, monkeypatch):
    """The pins are TVM's global op attributes: put back after the pass, and after a failing one."""
    mod, _, _ = _imported(tmp_path)
    op = tvm.ir.Op.get("relax.nn.layer_norm")
    before = op.get_attr("TMixedPrecisionPolicy")
    to_precision(mod, "fp16", ("LayerNormalization",))
    assert op.get_attr("TMixedPrecisionPolicy") == before
    monkeypatch.setattr(relax.transform, "ToMixedPrecision", lambda **kw: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(UserError):
        to_precision(mod, "fp16", ("LayerNormalization",))
    assert op.get_attr("TMixedPrecisionPolicy") == before


def test_fp32_changes_nothing(tmp_path):
    mod, _, _ = _imported(tmp_path)
    out, report = to_precision(mod, "fp32", DEFAULT_KEEP_FP32)
    assert out.same_as(mod) and "fp32 for this target" in report.summary


def test_kernels_the_importer_lowered_stay_fp32_and_in_place(tmp_path):
    """TVM's importer lowers some ops itself (a reflect Pad here, Clip, Tile; our recurrent loops):
    call_tir calls, which TVM's rewrite cannot take. They keep fp32 operands and their place."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
             helper.make_node("Conv", ["p", "w"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", F, [1, 8, 8, 8])],
                          [numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
                           numpy_helper.from_array(rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    path = save_model(m, tmp_path / "pad.onnx")
    x = rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)
    mod = import_relax(load_model(Path(path)), {"x": x.shape}, {"x": "float32"})
    mod = mod[0] if isinstance(mod, tuple) else mod
    assert "relax.call_tir" in _ops(mod)
    half = to_precision(mod, "fp16", DEFAULT_KEEP_FP32)[0]
    ops = _ops(half)
    assert ops["relax.call_tir"] and ops["relax.nn.conv2d"] == ["float16"]
    assert sorted(gv.name_hint for gv in half.functions) == sorted(gv.name_hint for gv in mod.functions)
    (got,) = _run(half, x)
    assert compare(got, ort_run(path, {"x": x})["y"], *PRECISION_TOLERANCE["fp16"])[2]


def test_clip_with_scalar_bounds_and_a_failing_rewrite(tmp_path, monkeypatch):
    """The importer's HardSigmoid is relax.clip with int64 scalar bounds, which TVM's rewrite
    rejects (PP-OCR's classifier): it becomes maximum/minimum first. A model the rewrite still
    fails on is one clear line naming the switch, not an internal error."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("HardSigmoid", ["c"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", F, [1, 8, 8, 8])],
                          [numpy_helper.from_array(np.full((8, 4, 1, 1), 0.1, np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    path = save_model(m, tmp_path / "hs.onnx")
    mod = import_relax(load_model(Path(path)), {"x": (1, 4, 8, 8)}, {"x": "float32"})
    mod = mod[0] if isinstance(mod, tuple) else mod
    assert "relax.clip" in _ops(mod)
    half = to_precision(mod, "fp16", DEFAULT_KEEP_FP32)[0]
    assert _ops(half)["relax.nn.conv2d"] == ["float16"] and "relax.clip" not in _ops(half)
    monkeypatch.setattr(relax.transform, "ToMixedPrecision",
                        lambda **kw: lambda m: (_ for _ in ()).throw(tvm.error.InternalError("Check failed: x")))
    with pytest.raises(UserError, match="optimize.precision fp16: TVM's mixed-precision rewrite failed"):
        to_precision(mod, "fp16", DEFAULT_KEEP_FP32)
