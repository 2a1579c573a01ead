"""Operators TVM's importer lacks, lowered into ones it compiles (each hook: (node, types, builder)
-> replacement nodes; registered in rewrites.REWRITES): LSTM/GRU/RNN (recurrent.py), Resize
(resize.py), CumSum/TopK (selection.py), QLinearMatMul/QLinearConv/ConvInteger (quantized.py).
A node a hook cannot lower under this profile is a clear error naming it (partial offload keeps
what it can tell up front in ONNX Runtime)."""
from __future__ import annotations

import numpy as np
from onnx import helper

from ..errors import UserError
from . import quantized, recurrent, resize, selection
from .attrs import constant, initializer
from .model import STATIC_OPERANDS


def _refuse(node, why: str) -> UserError:
    return UserError(f"node {node.name or '?'} ({node.op_type}): {why}; keep it in ONNX Runtime "
                     "(onnxruntime.keep_nodes)")


def _recurrent(node, t, b):
    ins = list(node.input) + [""] * 8
    x_shape = t.shape.get(ins[0])
    weights = {n: initializer(b.graph, n) for n in (ins[1], ins[2], ins[3], ins[7]) if n}
    where = f"node {node.name or '?'} ({node.op_type})"
    if any(v is None for v in weights.values()):
        raise UserError(f"{where}: its weights are computed at run time; a recurrent layer compiles only with "
                        "constant W/R/B/P (keep it in ONNX Runtime: onnxruntime.keep_nodes)")
    if x_shape is None or None in x_shape:
        raise UserError(f"{where}: input '{ins[0]}' has no static shape under this profile")
    return recurrent.lower(node, t.shape, weights, b)


def _resize(node, t, b):
    in_shape, out_shape = t.shape.get(node.input[0]), t.shape.get(node.output[0])
    elem = t.elem.get(node.input[0])
    why = resize.unsupported(node, None if elem is None else helper.tensor_dtype_to_np_dtype(elem).name)
    consts = {}
    for key, name in zip(("roi", "scales", "sizes"), node.input[1:4]):
        if name:
            consts[key] = constant(b.graph, name)
            if consts[key] is None:
                why = why or f"its {key} '{name}' is computed at run time"
    if not why and (in_shape is None or out_shape is None or None in in_shape or None in out_shape):
        why = "its input or output has no static shape under this profile"
    if why:
        raise _refuse(node, why)
    dtype = helper.tensor_dtype_to_np_dtype(t.elem[node.input[0]])
    try:
        return resize.lower(node, in_shape, out_shape, dtype, b.opset, consts,
                            recurrent.Emitter(b, node.name or "resize", dtype))
    except ValueError as e:
        raise _refuse(node, f"cannot be lowered: {e}") from None


def _static_input(node, t, b, what: str) -> tuple[tuple[int, ...], np.ndarray]:
    """(static shape of input 0, value of input 1) or a clear error."""
    shape = t.shape.get(node.input[0])
    value = constant(b.graph, node.input[1]) if len(node.input) > 1 and node.input[1] else None
    if value is None:
        raise _refuse(node, f"its {what} '{node.input[1]}' is computed at run time")
    if shape is None or None in shape:
        raise UserError(f"node {node.name or '?'} ({node.op_type}): input '{node.input[0]}' has no static shape "
                        "under this profile")
    return shape, value


def _cumsum(node, t, b):
    shape, axis = _static_input(node, t, b, "axis")
    axis = int(axis.ravel()[0]) % len(shape)
    if shape[axis] > selection.CUMSUM_MAX_LENGTH:
        raise _refuse(node, f"a running sum over {shape[axis]} elements (compiled: <= {selection.CUMSUM_MAX_LENGTH})")
    dtype = helper.tensor_dtype_to_np_dtype(t.elem[node.input[0]])
    return selection.cumsum(node, shape, axis, dtype, recurrent.Emitter(b, node.name or "cumsum", dtype))


def _topk(node, t, b):
    shape, k = _static_input(node, t, b, "k")
    dtype = helper.tensor_dtype_to_np_dtype(t.elem[node.input[0]])
    return selection.topk(node, shape, int(k.ravel()[0]), dtype, recurrent.Emitter(b, node.name or "topk", dtype))


def _quantized(node, t, b):
    c = [constant(b.graph, n) if n else None for n in node.input]
    computed = [node.input[i] for i in STATIC_OPERANDS[node.op_type] if i < len(node.input) and node.input[i]
                and c[i] is None]
    if computed:
        raise _refuse(node, f"its quantization parameters/weights {computed} are computed at run time")
    e = recurrent.Emitter(b, node.name or node.op_type.lower(), np.float32)
    if node.op_type == "QLinearMatMul":
        return quantized.qlinear_matmul(node, c, e)
    return quantized.qlinear_conv(node, c, e) if node.op_type == "QLinearConv" else quantized.conv_integer(node, c, e)


# what each lowered operator becomes, for the build report (QLinearConv/ConvInteger are not int8 kernels)
LOWERED_TO = {"LSTM": "unrolled steps", "GRU": "unrolled steps", "RNN": "unrolled steps",
              "Resize": "per-axis gathers", "CumSum": "a triangular MatMul", "TopK": "ArgMax rounds",
              "QLinearMatMul": "MatMulInteger (int8) + requantize", "QLinearConv": "a float32 Conv + requantize",
              "ConvInteger": "a float32 Conv"}


def describe_lowered(lowered: dict[str, int]) -> str:
    """'QLinearConv x3 -> a float32 Conv + requantize, Resize x2 -> per-axis gathers'"""
    return ", ".join(f"{op} x{n} -> {LOWERED_TO[op]}" for op, n in sorted(lowered.items()))


LOWERINGS = {"LSTM": _recurrent, "GRU": _recurrent, "RNN": _recurrent, "Resize": _resize, "CumSum": _cumsum,
             "TopK": _topk, "QLinearMatMul": _quantized, "QLinearConv": _quantized, "ConvInteger": _quantized}
