"""Resize lowered to gathers and weighted sums along each resized axis, with the weights ONNX Runtime
itself computes.

Every ONNX Resize mode is separable: the value at an output position is a sum over input positions
of a product of per-axis weights (nearest: one tap; linear: two; cubic: four; antialias: as many as
the filter covers). With static shapes the per-axis weights are constants, so for each resized axis
we run that axis alone through onnxruntime on an identity matrix (rows = input positions) and read
the matrix M_a [in, out] back. That reproduces every coordinate transform, nearest rounding mode,
cubic coefficient, exclude_outside, antialias, axes and tf_crop_and_resize exactly as onnxruntime
(the verify reference) defines them, instead of re-deriving the formulas; TVM's resize maps
coordinates with the size ratio rather than the given scale and has no antialias, so it is not used.

The graph then has, per resized axis: Gather with constant indices (one tap: exact, no
arithmetic), sum_k Gather(x, idx_k) * w_k (up to MAX_TAPS taps: injective ops TVM fuses into one
kernel), or a MatMul with M_a (wider filters). tf_crop_and_resize writes extrapolation_value
where any axis falls outside the crop: the weights are zero there and a constant adds the value.

Matching onnxruntime rather than ONNX's reference outputs is deliberate (it is what the package
is verified and deployed against): the two differ on align_corners with a fractional downscale,
where this lowering gives onnxruntime's values.

Not lowered (the node stays in ONNX Runtime): keep_aspect_ratio_policy other than stretch (its
scale and its rounded output size do not describe one per-axis resize), integer inputs with a
weighted mode (onnxruntime rounds them), scales/sizes/roi computed at run time.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .attrs import attr

MAX_TAPS = 4
# attributes that describe how all axes relate; the per-axis resize gets the effective scale instead
WHOLE_TENSOR_ATTRS = {"axes", "extrapolation_value"}


def unsupported(node: onnx.NodeProto, dtype: str | None) -> str | None:
    """Why this Resize cannot be lowered from what the node and its input's dtype say, or None."""
    if attr(node, "mode", b"nearest") != b"nearest" and dtype is not None and not dtype.startswith("float"):
        return "interpolates integers (onnxruntime rounds them; only mode 'nearest' compiles for integer inputs)"
    return None


def effective_scales(node: onnx.NodeProto, in_shape: tuple[int, ...], scales: np.ndarray | None,
                     sizes: np.ndarray | None) -> tuple[list[float], list[int]]:
    """Per-axis scale and output size as the ONNX spec computes them (with `axes`)."""
    rank = len(in_shape)
    axes = [a % rank for a in attr(node, "axes", list(range(rank)))]
    scale, out = [1.0] * rank, list(in_shape)
    if scales is not None and scales.size:
        for a, s in zip(axes, scales.astype(np.float64)):
            scale[a], out[a] = float(s), int(np.floor(in_shape[a] * float(np.float32(s))))
    else:
        for a, size in zip(axes, sizes):
            scale[a], out[a] = float(size) / in_shape[a], int(size)
    return scale, out


def axis_weights(node: onnx.NodeProto, opset: int, n: int, m: int, scale: float,
                 roi: tuple[float, float] | None) -> np.ndarray:
    """M [n, m]: output position o along this axis is sum_j M[j, o] * x[j] (zero columns where
    tf_crop_and_resize extrapolates). Computed by onnxruntime on the identity matrix."""
    import onnxruntime as ort

    if int(np.floor(n * float(np.float32(scale)))) == m:
        scales, sizes = np.array([1.0, scale], np.float32), np.zeros(0, np.int64)
    elif abs(m / n - scale) <= 1e-6 * scale:          # the same scale, given as a size
        scales, sizes = np.zeros(0, np.float32), np.array([n, m], np.int64)
    else:
        raise ValueError(f"an output size of {m} from {n} does not follow from the scale {scale:g}")
    roi_value = np.array([0, roi[0], 1, roi[1]] if roi else [], np.float32)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in WHOLE_TENSOR_ATTRS}
    inits = [numpy_helper.from_array(roi_value, "roi"), numpy_helper.from_array(scales, "scales"),
             numpy_helper.from_array(sizes, "sizes")]
    g = helper.make_graph([helper.make_node("Resize", ["x", "roi", "scales", "sizes" if sizes.size else ""], ["y"],
                                            **attrs)], "axis",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": np.eye(n, dtype=np.float32)})
    if y.shape != (n, m):
        raise ValueError(f"onnxruntime resizes {n} to {y.shape[1]} along this axis, shape inference says {m}")
    return y


def lower(node: onnx.NodeProto, in_shape: tuple[int, ...], out_shape: tuple[int, ...], dtype, opset: int,
          consts: dict, e) -> list[onnx.NodeProto]:
    """The nodes computing `node`'s output. `consts`: values of roi/scales/sizes (absent = not
    given); `e`: the node emitter (fresh names, memoized constants) of the recurrent lowering.
    ValueError when onnxruntime's reading of the node disagrees with shape inference."""
    rank = len(in_shape)
    scale, out = effective_scales(node, in_shape, consts.get("scales"), consts.get("sizes"))
    if tuple(out) != tuple(out_shape):
        raise ValueError(f"the spec's formulas give the output shape {out}, shape inference {list(out_shape)}")
    crop = attr(node, "coordinate_transformation_mode", b"half_pixel") == b"tf_crop_and_resize"
    roi = consts.get("roi")
    if crop and roi is not None and roi.size == 2 * len(attr(node, "axes", range(rank))) and roi.size != 2 * rank:
        full = [0.0] * rank + [1.0] * rank           # roi given only for `axes`
        axes = [a % rank for a in attr(node, "axes")]
        for k, a in enumerate(axes):
            full[a], full[rank + a] = float(roi[k]), float(roi[len(axes) + k])
        roi = np.array(full)
    x, inside = node.input[0], []
    for a in range(rank):
        if out[a] == in_shape[a] and scale[a] == 1.0 and not crop:
            continue
        M = axis_weights(node, opset, in_shape[a], out[a], scale[a], (roi[a], roi[rank + a]) if crop else None)
        if M.shape[0] == M.shape[1] and np.array_equal(M, np.eye(M.shape[0], dtype=M.dtype)):
            continue                                  # e.g. a crop of [0, 1] on the batch axis
        x = along_axis(e, x, M.astype(dtype), a, rank)
        inside.append((a, M.sum(axis=0) != 0))
    ev = float(attr(node, "extrapolation_value", 0.0))
    if crop and ev != 0.0:
        mask = np.ones(out, bool)
        for a, ins in inside:
            mask &= ins.reshape([-1 if b == a else 1 for b in range(rank)])
        if not mask.all():
            x = e("Add", [x, e.const("extrapolate", np.where(mask, 0, ev).astype(dtype))])
    e("Identity", [x], node.output[0])
    return e.nodes


def along_axis(e, x: str, M: np.ndarray, axis: int, rank: int) -> str:
    """x mapped along `axis` by M [in, out] (out[o] = sum_j M[j, o] x[j]): one Gather, a few
    weighted Gathers, or a MatMul."""
    taps = int((M != 0).sum(axis=0).max(initial=0))
    order = np.argsort(M == 0, axis=0, kind="stable")[:max(taps, 1)]      # nonzero rows first per column
    if taps == 1 and np.isin(M, (0.0, 1.0)).all() and (M.sum(axis=0) == 1).all():
        return e("Gather", [x, e.const("index", order[0].astype(np.int64))], axis=axis)
    if taps <= MAX_TAPS:
        bcast = [-1 if b == axis else 1 for b in range(axis, rank)]
        acc = None
        for k in range(taps):
            w = np.take_along_axis(M, order[k:k + 1], axis=0)[0]
            g = e("Gather", [x, e.const("index", order[k].astype(np.int64))], axis=axis)
            term = e("Mul", [g, e.const("weight", w.reshape(bcast))])
            acc = term if acc is None else e("Add", [acc, term])
        return acc
    if axis == rank - 1:
        return e("MatMul", [x, e.const("matrix", M)])
    if axis == rank - 2:
        return e("MatMul", [e.const("matrix", np.ascontiguousarray(M.T)), x])
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    moved = e("Transpose", [x], perm=perm)
    return e("Transpose", [e("MatMul", [moved, e.const("matrix", M)])], perm=perm)
