"""Test models that exercise many operators at once (built with the samples' GraphBuilder).

`mobile_block`: MobileNet/EfficientNet-style ops (1x1 + depthwise conv, ReLU6 as Clip, HardSwish,
squeeze-excite, Pad, AveragePool, Split/Concat/Slice, Where, LogSoftmax).
`attention_block`: exporter-style transformer ops (Gather embedding, Shape/Slice/Concat shape
arithmetic, causal mask with Trilu/Where, decomposed LayerNorm, erf GELU, Einsum, Expand, Cast).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from make_samples import GraphBuilder


def mobile_block() -> onnx.ModelProto:
    g = GraphBuilder(seed=5)
    x = "x"  # [1, 16, 28, 28]
    # mobilenet-ish inverted residual
    e = g.op("Conv", [x, g.weight("w", (64, 16, 1, 1))])
    e = g.op("Clip", [e, g.const("lo", np.array(0, np.float32)), g.const("hi", np.array(6, np.float32))])
    d = g.op("Conv", [e, g.weight("w", (64, 1, 3, 3))], group=64, pads=[1,1,1,1], strides=[1,1])
    d = g.op("HardSwish", [d])
    p = g.op("Conv", [d, g.weight("w", (16, 64, 1, 1))])
    r = g.op("Add", [x, p])
    # squeeze-excite
    s = g.op("ReduceMean", [r], axes=[2, 3], keepdims=1)
    s = g.op("Sigmoid", [g.op("Conv", [s, g.weight("w", (16, 16, 1, 1)), g.weight("b", (16,), 0.1)])])
    r = g.op("Mul", [r, s])
    # strided depthwise + pad + avgpool
    r2 = g.op("Conv", [r, g.weight("w", (16, 1, 5, 5))], group=16, pads=[2,2,2,2], strides=[2,2])
    r2 = g.op("Pad", [r2, g.const("pads", np.array([0,0,1,1,0,0,1,1], np.int64))], mode="constant")
    r2 = g.op("AveragePool", [r2], kernel_shape=[3,3], strides=[1,1], count_include_pad=0)  # 14x14
    a, b = g.op("Split", [r2, g.const("split", np.array([8, 8], np.int64))], n_out=2, axis=1)
    c = g.op("Concat", [g.op("Tanh", [b]), g.op("Mul", [a, g.op("Sigmoid", [a])])], axis=1)
    sl = g.op("Slice", [c, g.const("st", np.array([0, 2], np.int64)), g.const("en", np.array([16, 14], np.int64)), g.const("ax", np.array([1, 3], np.int64))])
    fl = g.op("Flatten", [sl], axis=1)   # 16*14*12
    m = g.op("Gemm", [fl, g.weight("fc", (16*14*12, 32)), g.weight("fb", (32,), 0.1)])
    m2 = g.op("Where", [g.op("Greater", [m, g.const("z", np.array(0, np.float32))]), m, g.op("Mul", [m, g.const("ls", np.array(0.1, np.float32))])])
    g.op("LogSoftmax", [m2], axis=1)
    g.nodes[-1].output[0] = "y"
    return g.model("mobile_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 28, 28])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], opset=17)


def attention_block() -> onnx.ModelProto:
    g = GraphBuilder(seed=6)
    x = "x"  # [2, 16, 32]
    ids = "ids"  # int64 [2, 16]
    emb = g.op("Gather", [g.weight("emb", (50, 32), 1.0), ids], axis=0)
    h = g.op("Add", [x, emb])
    # shape arithmetic as exporters write it: reshape to [B, S, 4, 8] via Shape/Slice/Concat
    shp = g.op("Shape", [h])
    bs = g.op("Slice", [shp, g.const("s0", np.array([0], np.int64)), g.const("s2", np.array([2], np.int64))])
    newshape = g.op("Concat", [bs, g.const("hd", np.array([4, 8], np.int64))], axis=0)
    q = g.op("Transpose", [g.op("Reshape", [g.op("MatMul", [h, g.weight("wq", (32, 32))]), newshape])], perm=[0, 2, 1, 3])
    k = g.op("Transpose", [g.op("Reshape", [g.op("MatMul", [h, g.weight("wk", (32, 32))]), newshape])], perm=[0, 2, 3, 1])
    v = g.op("Transpose", [g.op("Reshape", [g.op("MatMul", [h, g.weight("wv", (32, 32))]), newshape])], perm=[0, 2, 1, 3])
    sc = g.op("Div", [g.op("MatMul", [q, k]), g.const("sq", np.array(np.sqrt(8), np.float32))])
    # causal mask via Trilu + Where
    ones = g.op("ConstantOfShape", [g.const("ms", np.array([16, 16], np.int64))], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]))
    tri = g.op("Trilu", [ones], upper=0)
    mask = g.op("Equal", [tri, g.const("zero", np.array(0, np.float32))])
    sc = g.op("Where", [mask, g.const("ninf", np.array(-1e9, np.float32)), sc])
    att = g.op("MatMul", [g.op("Softmax", [sc], axis=-1), v])
    att = g.op("Reshape", [g.op("Transpose", [att], perm=[0, 2, 1, 3]), g.const("bs3", np.array([2, 16, 32], np.int64))])
    h = g.op("Add", [h, att])
    # decomposed layernorm (older exporters)
    mu = g.op("ReduceMean", [h], axes=[-1])
    dlt = g.op("Sub", [h, mu])
    var = g.op("ReduceMean", [g.op("Pow", [dlt, g.const("two", np.array(2, np.float32))])], axes=[-1])
    hn = g.op("Div", [dlt, g.op("Sqrt", [g.op("Add", [var, g.const("eps", np.array(1e-5, np.float32))])])])
    # erf gelu
    f = g.op("MatMul", [hn, g.weight("w1", (32, 64))])
    gel = g.op("Mul", [g.op("Mul", [f, g.const("half", np.array(0.5, np.float32))]), g.op("Add", [g.op("Erf", [g.op("Div", [f, g.const("r2", np.array(np.sqrt(2), np.float32))])]), g.const("one", np.array(1, np.float32))])])
    o = g.op("Einsum", [gel, g.weight("w2", (64, 32))], equation="bsf,fd->bsd")
    ones_i = g.op("Expand", [g.const("bias_i", np.array([1], np.int64)), g.const("es", np.array([2, 16, 32], np.int64))])
    g.op("Add", [o, g.op("Cast", [ones_i], to=TensorProto.FLOAT)])
    g.nodes[-1].output[0] = "y"
    return g.model("attention_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 32]), helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 16])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 32])], opset=14)


def partial_offload_model() -> onnx.ModelProto:
    """MatMul/Relu -> com.microsoft.Gelu (ORT contrib op) -> MatMul/Add -> TopK -> Softmax, Cast:
    two ops the packager does not compile (a contrib op; TopK with k above what it unrolls)
    split the graph into four compiled parts."""
    g = GraphBuilder(seed=9)
    h = g.op("Relu", [g.op("MatMul", ["x", g.weight("w1", (32, 64))])])
    gl = g.op("Gelu", [h])
    g.nodes[-1].domain = "com.microsoft"
    h2 = g.op("Add", [g.op("MatMul", [gl, g.weight("w2", (64, 48))]), g.weight("b2", (48,), 0.1)])
    vals, idx = g.op("TopK", [h2, g.const("k", np.array([40], np.int64))], n_out=2, axis=-1)
    g.op("Softmax", [g.op("Mul", [vals, g.const("t", np.array(2.0, np.float32))])], axis=-1)
    g.nodes[-1].output[0] = "probs"
    g.op("Cast", [idx], to=TensorProto.FLOAT)
    g.nodes[-1].output[0] = "index_f"
    graph = helper.make_graph(g.nodes, "partial", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 5]),
                               helper.make_tensor_value_info("index_f", TensorProto.FLOAT, ["batch", 5])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model
