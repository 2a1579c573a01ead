"""QLinearMatMul, QLinearConv and ConvInteger written in operators TVM's importer compiles.

The importer has none of the three. With their quantization parameters constant:

* QLinearMatMul accumulates exactly in int32 with MatMulInteger (which TVM lowers to an int8/uint8
  kernel), then requantizes: QuantizeLinear(float(acc) * (a_scale * b_scale / y_scale), 1, y_zp),
  the formula of ONNX's reference.
* QLinearConv and ConvInteger run a float32 Conv on zero-point-shifted values (the weights shifted
  and converted at build time): every product and partial sum of 8-bit operands is an integer
  below 2^24 for up to 256 full-range terms, so the accumulator is exact there and within float32
  rounding beyond it. QLinearConv then requantizes like QLinearMatMul (per output channel when
  w_scale is); ConvInteger casts the accumulator to int32. These convolutions run in float32
  kernels, not int8 ones.
"""
from __future__ import annotations

import numpy as np
import onnx

CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _conv_attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.name in CONV_ATTRS}


def _requantize(e, acc_f: str, multiplier: np.ndarray, y_zp: np.ndarray, out: str) -> None:
    scaled = e("Mul", [acc_f, e.const("multiplier", multiplier.astype(np.float32))])
    e("QuantizeLinear", [scaled, e.const("one", np.array(1.0, np.float32)), e.const("y_zp", y_zp)], out)


def qlinear_matmul(node: onnx.NodeProto, c: list, e) -> list[onnx.NodeProto]:
    """c: the constant inputs by position (None where computed)."""
    a, b = node.input[0], node.input[3]
    a_s, a_zp, b_s, b_zp, y_s, y_zp = c[1], c[2], c[4], c[5], c[6], c[7]
    acc = e("MatMulInteger", [a, b, e.const("a_zp", a_zp), e.const("b_zp", b_zp)])
    a_s = a_s.reshape(-1, 1) if a_s.size > 1 else a_s                  # per row of A
    multiplier = (a_s * b_s / y_s).astype(np.float32)                   # in the scales' own type first
    _requantize(e, e("Cast", [acc], to=onnx.TensorProto.FLOAT), multiplier, y_zp, node.output[0])
    return e.nodes


def _shifted_conv(node: onnx.NodeProto, x: str, x_zp: np.ndarray, w: np.ndarray, w_zp: np.ndarray,
                  bias: np.ndarray | None, e) -> str:
    w_zp = w_zp.reshape((-1,) + (1,) * (w.ndim - 1)) if w_zp.size > 1 else w_zp
    w_f = (w.astype(np.int32) - w_zp.astype(np.int32)).astype(np.float32)
    x_f = e("Sub", [e("Cast", [x], to=onnx.TensorProto.FLOAT), e.const("x_zp", x_zp.astype(np.float32))])
    inputs = [x_f, e.const("w", w_f)] + ([e.const("bias", bias.astype(np.float32))] if bias is not None else [])
    return e("Conv", inputs, **_conv_attrs(node))


def qlinear_conv(node: onnx.NodeProto, c: list, e) -> list[onnx.NodeProto]:
    x_s, x_zp, w, w_s, w_zp, y_s, y_zp = c[1], c[2], c[3], c[4], c[5], c[6], c[7]
    bias = c[8] if len(c) > 8 else None
    acc_f = _shifted_conv(node, node.input[0], x_zp, w, w_zp, bias, e)
    w_s = w_s.reshape(-1, 1, 1) if w_s.size > 1 else w_s               # per output channel
    multiplier = (x_s * w_s / y_s).astype(np.float32)
    _requantize(e, acc_f, multiplier.reshape(multiplier.shape[-3:]) if multiplier.ndim > 3 else multiplier,
                y_zp, node.output[0])
    return e.nodes


def conv_integer(node: onnx.NodeProto, c: list, e) -> list[onnx.NodeProto]:
    x_zp = c[2] if len(c) > 2 and c[2] is not None else np.array(0, np.int32)
    w_zp = c[3] if len(c) > 3 and c[3] is not None else np.array(0, np.int32)
    acc_f = _shifted_conv(node, node.input[0], x_zp, c[1], w_zp, None, e)
    e("Cast", [acc_f], node.output[0], to=onnx.TensorProto.INT32)
    return e.nodes
