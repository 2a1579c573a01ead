"""ONNX's NaN and infinity semantics (optimize/ieee.py, frontend Clip defaults): Relu, Clip, Max and
Min of NaN are NaN and Clip without bounds clamps +-inf to +-FLT_MAX, as onnxruntime computes;
checked on the legalized kernels against onnxruntime, and end to end through a package."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from packager.frontend import import_relax, load_model
from packager.optimize.ieee import LEGALIZATIONS
from packager.optimize.variadic import variadic_to_binary
from packager.optimize.layout.clip import clip_as_ops
from packager.optimize.relax_util import legalize
from support.helpers import ort_run, run_pack, save_model, write_spec

F = TensorProto.FLOAT
SPECIAL = np.array([[np.nan, np.inf, -np.inf, 1.0, -2.0, 0.0]], np.float32)


def _model() -> onnx.ModelProto:
    """t = x + w (w holds NaN and +-inf); Relu, Max/Min with x and with a constant, 3-way Max, Clip
    without bounds and with bounds (ReLU6), HardSigmoid and HardSwish (relax.clip in the importer)."""
    inits = [numpy_helper.from_array(SPECIAL, "w"), numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    nodes = [helper.make_node("Add", ["x", "w"], ["t"]),
             helper.make_node("Relu", ["t"], ["relu"]),
             helper.make_node("Max", ["t", "x"], ["max_tx"]), helper.make_node("Max", ["x", "t"], ["max_xt"]),
             helper.make_node("Min", ["t", "x"], ["min_tx"]), helper.make_node("Max", ["t", "half"], ["max_c"]),
             helper.make_node("Max", ["x", "t", "x"], ["max3"]),
             helper.make_node("Clip", ["t"], ["clip_none"]), helper.make_node("Clip", ["t", "lo", "hi"], ["relu6"]),
             helper.make_node("HardSigmoid", ["t"], ["hsig"]), helper.make_node("HardSwish", ["t"], ["hswish"])]
    outs = ["relu", "max_tx", "max_xt", "min_tx", "max_c", "max3", "clip_none", "relu6", "hsig", "hswish"]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 6])],
                          [helper.make_tensor_value_info(o, F, [1, 6]) for o in outs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_legalized_kernels_keep_nan_and_clamp_infinities_like_onnxruntime(tmp_path):
    path = save_model(_model(), tmp_path / "m.onnx")
    x = np.array([[1.0, -1.0, 2.0, 5.0, np.nan, -3.0]], np.float32)
    want = ort_run(path, {"x": x})
    mod = import_relax(load_model(Path(path)), {"x": (1, 6)}, {"x": "float32"})
    mod = mod[0] if isinstance(mod, tuple) else mod
    mod = legalize(clip_as_ops(variadic_to_binary(mod))[0], LEGALIZATIONS)
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x))
    for k, name in enumerate(want):
        np.testing.assert_array_equal(got[k].numpy(), want[name], err_msg=name)


def test_the_stacked_max_becomes_binary_maximums(tmp_path):
    path = save_model(_model(), tmp_path / "m.onnx")
    mod = import_relax(load_model(Path(path)), {"x": (1, 6)}, {"x": "float32"})
    mod = mod[0] if isinstance(mod, tuple) else mod
    text = variadic_to_binary(mod).script()
    assert "R.stack(" not in text and "R.max(" not in text
    assert text.count("R.maximum(") == 6 and text.count("R.minimum(") == 2
    assert clip_as_ops(variadic_to_binary(mod))[1] == 4          # ReLU6's TOPI max and min kernels, 2 relax.clip


@pytest.mark.slow
def test_a_package_with_nan_and_inf_weights_verifies(tmp_path):
    """End to end on x86-64 (layout pass on) and with layouts off, and on h100 run as OpenCL on
    PoCL, whose fmax/fmin drop a NaN operand as CUDA's do."""
    save_model(_model(), tmp_path / "model.onnx")
    for name, extra in (("m", ""), ("plain", "optimize: {passes: {layout: false}}\n")):
        spec = write_spec(tmp_path, f"name: {name}\nmodel: model.onnx\ntargets: [x86-64, h100]\n{extra}",
                          f"{name}.yaml")
        assert run_pack("build", spec).returncode == 0
        r = run_pack("verify", tmp_path / "dist" / name, *(["--gpu-emulate"] if _pocl() else []))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "x86-64" in r.stdout and (not _pocl() or "h100 on PoCL" in r.stdout), r.stdout


def _pocl() -> bool:
    import importlib.util
    return importlib.util.find_spec("pyopencl") is not None
