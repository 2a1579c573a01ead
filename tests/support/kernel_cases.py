"""One-op ONNX models lowered to TVM kernels, and running a kernel in-process: shared by the
CPU schedule tests (rule-based and Gensor)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

from packager.frontend import LoadedModel, TensorInfo, import_relax
from packager.codegen.graph import extract_graph
from packager.optimize.pipeline import optimize_graph
from packager.optimize.schedule.registry import scheduler_for
from packager.spec import OptimizeSpec, TargetSpec
from packager.targets import can_run_here, resolve

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def case(op, inputs, attrs=None, inits=None, extra_nodes=()):
    """A one-op model (+ an element-wise tail): graph inputs {name: shape}, initializers {name:
    array}; initializers named '_...' feed the tail, not the op."""
    inits = inits or {}
    names = list(inputs) + [n for n in inits if not n.startswith("_")]
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


def _imported(model: onnx.ModelProto):
    inputs = [TensorInfo(v.name, "float32", tuple(d.dim_value for d in v.type.tensor_type.shape.dim))
              for v in model.graph.input]
    loaded = LoadedModel(None, model, 17, inputs, [TensorInfo("y", "float32", ())])
    mod, _ = import_relax(loaded, {i.name: i.shape for i in inputs}, {i.name: "float32" for i in inputs})
    return mod, inputs


def optimized_module(model: onnx.ModelProto, target=None, **passes):
    """The model's Relax module after the level-2 graph passes (`passes` switches some off)."""
    mod, _ = _imported(model)
    return optimize_graph(mod, OptimizeSpec(level=2, passes=passes), target)[0]


def kernels_of(model: onnx.ModelProto) -> dict:
    mod, inputs = _imported(model)
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




def phased_matmuls(n: int = 128, k: int = 64, m: int = 64):
    """Two chained matmuls as one kernel of two phases (what global fusion makes of a chain on a
    GPU target): e = (a @ b) @ d, the product passed between the phases, both phases held to
    64 threads per block as global fusion holds a chain's Gensor phases to one block."""
    from tvm import te

    from packager.optimize.schedule.phases import PHASE_ATTR, THREADS_ATTR

    a, b, d = te.placeholder((n, k), name="a"), te.placeholder((k, m), name="b"), te.placeholder((m, m), name="d")
    r, r2 = te.reduce_axis((0, k), name="r"), te.reduce_axis((0, m), name="r2")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="c")
    e = te.compute((n, m), lambda i, j: te.sum(c[i, r2] * d[r2, j], axis=r2), name="e")
    return te.create_prim_func([a, b, d, e]).with_attrs({PHASE_ATTR: [1, 1], THREADS_ATTR: 64})


def scores_attention(rows: int, n: int, d: int):
    """softmax(Q @ K^T / 8) @ V: FuseOps leaves three kernels (the scores, the softmax, P @ V)."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Div", ["s0", "eight"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    m = case("Identity", {"q": [1, 2, rows, d], "kt": [1, 2, d, n], "v": [1, 2, n, d]},
             inits={"eight": np.array(8.0, np.float32)})
    m.graph.node.pop()
    m.graph.node.extend(nodes)
    return m


def conv_then_channel_sum(channels: int, out_channels: int, size: int, summed_to: int = 1):
    """A dilated 3x3 conv (+ bias, ReLU) read only by a 1x1 conv to `summed_to` channels (CSRNet's
    density-map head): FuseOps leaves two kernels."""
    from onnx import numpy_helper

    nodes = [helper.make_node("Relu", ["y"], ["z"]), helper.make_node("Conv", ["z", "w2", "b2"], ["o"])]
    m = case("Conv", {"x": [1, channels, size, size]}, {"pads": [2] * 4, "dilations": [2, 2]},
             {"w": w(out_channels, channels, 3, 3), "b": w(out_channels)}, nodes)
    m.graph.initializer.extend([numpy_helper.from_array(w(summed_to, out_channels, 1, 1), "w2"),
                                numpy_helper.from_array(w(summed_to), "b2")])
    return m


def loops_of(stmt) -> list:
    """Every For loop of a kernel body, outermost first."""
    import tvm_ffi

    found: list = []
    tvm_ffi.structural_walk(stmt, (tvm.tirx.For, found.append), order="pre")
    return found


def scheduler(target, database=None, measure: bool = True, **opt):
    """The target's scheduler (the scheduling contract the passes call) under an optimize spec
    with these settings."""
    return scheduler_for(target, OptimizeSpec(database=database, measure=measure, **opt))
