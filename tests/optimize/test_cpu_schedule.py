"""The rule-based CPU schedule: every kernel computes exactly what TVM's unscheduled kernel computes,
and conv/matmul-like kernels really are parallel + vectorized. Runs kernels in-process with TVM."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

from packager.frontend import LoadedModel, TensorInfo, import_relax
from packager.lowering import extract_graph
from packager.optimize.cpu_schedule import CpuRules, schedule_kernels
from packager.optimize.pipeline import optimize_graph
from packager.spec import OptimizeSpec, TargetSpec
from packager.targets import can_run_here, resolve

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def case(op, inputs, attrs=None, inits=None, extra_nodes=()):
    """A one-op model: graph inputs {name: shape}, initializers {name: array}."""
    inits = inits or {}
    names = list(inputs) + list(inits)
    nodes = [helper.make_node(op, names, ["y"], **(attrs or {})), *extra_nodes]
    out = nodes[-1].output[0]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
                          [helper.make_tensor_value_info(out, F, None)],
                          [numpy_helper.from_array(v, n) for n, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


relu = helper.make_node("Relu", ["y"], ["z"])
CASES = {
    "conv3x3": case("Conv", {"x": [1, 16, 20, 20]}, {"pads": [1] * 4}, {"w": w(32, 16, 3, 3), "b": w(32)}, [relu]),
    "conv3x3_stride2": case("Conv", {"x": [1, 8, 18, 18]}, {"pads": [1] * 4, "strides": [2, 2]}, {"w": w(16, 8, 3, 3)}),
    "conv_odd_sizes": case("Conv", {"x": [1, 5, 17, 13]}, {"pads": [1, 0, 1, 0]}, {"w": w(7, 5, 3, 2)}),
    "conv_depthwise": case("Conv", {"x": [1, 16, 14, 14]}, {"pads": [1] * 4, "group": 16}, {"w": w(16, 1, 3, 3)}),
    "conv_grouped": case("Conv", {"x": [1, 8, 10, 10]}, {"group": 2}, {"w": w(12, 4, 3, 3)}),
    "conv_dilated": case("Conv", {"x": [1, 4, 16, 16]}, {"dilations": [2, 2], "pads": [2] * 4}, {"w": w(8, 4, 3, 3)}),
    "conv1x1_batch2": case("Conv", {"x": [2, 32, 8, 8]}, {}, {"w": w(64, 32, 1, 1)}),
    "conv_transpose": case("ConvTranspose", {"x": [1, 8, 7, 7]}, {"strides": [2, 2]}, {"w": w(8, 4, 3, 3)}),
    "matmul_odd": case("MatMul", {"a": [37, 53]}, {}, {"b": w(53, 29)}),
    "matmul_batched": case("MatMul", {"a": [2, 3, 16, 8], "b": [2, 3, 8, 24]}),
    "matmul_batched_big": case("MatMul", {"a": [2, 4, 64, 32], "b": [2, 4, 32, 48]}),
    "gemm_transb": case("Gemm", {"a": [4, 64]}, {"transB": 1}, {"b": w(48, 64), "c": w(48)}),
    "maxpool": case("MaxPool", {"x": [1, 8, 15, 15]}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4}),
    "avgpool": case("AveragePool", {"x": [1, 8, 16, 16]}, {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "global_avgpool": case("GlobalAveragePool", {"x": [2, 16, 7, 7]}),
    "softmax_last": case("Softmax", {"x": [4, 37]}, {"axis": -1}),
    "softmax_axis1": case("Softmax", {"x": [2, 5, 6]}, {"axis": 1}),
    "layernorm": case("LayerNormalization", {"x": [3, 10, 48]}, {"axis": -1}, {"g": w(48), "b": w(48)}),
    "reduce_mean": case("ReduceMean", {"x": [4, 6, 8]}, {"axes": [1], "keepdims": 1}),
    "transpose": case("Transpose", {"x": [2, 3, 4, 5]}, {"perm": [0, 2, 3, 1]}),
    "add_broadcast": case("Add", {"a": [4, 1, 6], "b": [5, 1]}),
    "concat": case("Concat", {"a": [2, 3], "b": [2, 5]}, {"axis": 1}),
    "gelu_erf": case("Erf", {"x": [8, 33]}),
}


def host_target():
    t = resolve(TargetSpec("x86-64", {}, "test"))
    if not can_run_here(t):
        pytest.skip("the x86-64 target cannot run on this machine")
    return t


def kernels_of(model: onnx.ModelProto) -> dict:
    inputs = [TensorInfo(v.name, "float32", tuple(d.dim_value for d in v.type.tensor_type.shape.dim))
              for v in model.graph.input]
    loaded = LoadedModel(None, model, 17, inputs, [TensorInfo("y", "float32", ())])
    mod = import_relax(loaded, {i.name: i.shape for i in inputs}, {i.name: "float32" for i in inputs})
    mod, _ = optimize_graph(mod, OptimizeSpec(level=1))
    g = extract_graph(mod, [i.name for i in inputs], [model.graph.output[0].name])
    return {c.kernel: g.kernels[c.kernel] for c in g.calls}


def run_kernel(func, target, args):
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                         target=tvm.target.Target(target.llvm_target()))
    tensors = [tvm.runtime.tensor(a) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy()


def random_args(func):
    args = []
    for p in func.params:
        shape = [int(d) for d in p.shape]
        dt = str(p.dtype)
        args.append(RNG.standard_normal(shape).astype(dt) if dt.startswith("float")
                    else RNG.integers(0, 2, shape).astype(dt))
    return args


@pytest.mark.parametrize("name", sorted(CASES))
def test_scheduled_kernels_equal_unscheduled(name):
    target = host_target()
    rules = CpuRules(target)
    for kname, func in kernels_of(CASES[name]).items():
        scheduled, info = rules.schedule(func)
        args = random_args(func)
        ref = run_kernel(func, target, [a.copy() for a in args])
        got = run_kernel(scheduled, target, [a.copy() for a in args])
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=f"{name}/{kname} [{info.summary()}]")
        assert info.rule != "naive", f"{name}/{kname}: no rule applied ({info.note})"


@pytest.mark.parametrize("name", ["conv3x3", "conv3x3_stride2", "matmul_odd", "conv1x1_batch2", "matmul_batched_big"])
def test_conv_and_matmul_are_parallel_and_vectorized(name):
    target = host_target()
    for func in kernels_of(CASES[name]).values():
        _, info = CpuRules(target).schedule(func)
        assert info.rule == "tiled-reduction" and info.vector > 1, info
        assert info.parallel > 1 or name == "matmul_odd", info       # tiny matmul runs on one thread
        if name == "conv3x3_stride2":
            assert "de-interleaved" in info.note


def test_schedules_compile_for_arm64():
    """ARM64 codegen of every rule (running ARM code is covered by `pack verify` under qemu)."""
    arm = resolve(TargetSpec("arm64", {}, "test"))
    kernels = {}
    for name in ("conv3x3", "conv3x3_stride2", "softmax_last", "transpose", "maxpool"):
        for k, f in kernels_of(CASES[name]).items():
            kernels[f"{name}_{k}"] = f
    scheduled, report = schedule_kernels(kernels, arm)
    assert report.details["rules"].get("naive", 0) == 0, report.details
    lib = tvm.tirx.build(tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in scheduled.items()}),
                         target=tvm.target.Target(arm.llvm_target()))
    asm = lib.inspect_source("asm")
    assert "fmla" in asm                          # NEON fused multiply-add in the conv kernels
