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

keep_aspect_ratio_policy (not_larger / not_smaller) gives every resized axis the one scale of the
limiting axis and rounds the output length, which a single-axis resize cannot express; such an
axis is read from onnxruntime on a 4-D tensor whose third axis is the limiting one (constant
along it, so its resize leaves the values alone) and whose last is the identity (KeepAspect).

Not lowered (the node stays in ONNX Runtime): integer inputs with a weighted mode (onnxruntime
rounds them), scales/sizes/roi computed at run time.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .attrs import attr

MAX_TAPS = 4
LAST_AXIS_COST = 4.0       # a gather along the last axis per element, against one along another
# attributes that describe how all axes relate; the per-axis resize gets the effective scale instead
WHOLE_TENSOR_ATTRS = {"axes", "extrapolation_value"}


@dataclass(frozen=True)
class KeepAspect:
    """The limiting axis of a keep_aspect_ratio_policy resize: its length and requested size, and the
    size requested for the axis being lowered."""

    limit_in: int
    limit_size: int
    size: int


def unsupported(node: onnx.NodeProto, dtype: str | None) -> str | None:
    """Why this Resize cannot be lowered from what the node and its input's dtype say, or None."""
    if attr(node, "mode", b"nearest") != b"nearest" and dtype is not None and not dtype.startswith("float"):
        return "interpolates integers (onnxruntime rounds them; only mode 'nearest' compiles for integer inputs)"
    return None


def effective_scales(node: onnx.NodeProto, in_shape: tuple[int, ...], scales: np.ndarray | None,
                     sizes: np.ndarray | None) -> tuple[list[float], list[int], dict[int, KeepAspect]]:
    """Per-axis scale and output size as the ONNX spec computes them (with `axes` and
    keep_aspect_ratio_policy), and the axes a policy other than stretch ties to a limiting one."""
    rank = len(in_shape)
    axes = [a % rank for a in attr(node, "axes", list(range(rank)))]
    scale, out = [1.0] * rank, list(in_shape)
    if scales is not None and scales.size:
        for a, s in zip(axes, scales.astype(np.float64)):
            scale[a], out[a] = float(s), int(np.floor(in_shape[a] * float(np.float32(s))))
        return scale, out, {}
    policy = attr(node, "keep_aspect_ratio_policy", b"stretch")
    ratios = {a: float(np.float32(size) / np.float32(in_shape[a])) for a, size in zip(axes, sizes)}
    if policy == b"stretch":
        for a, size in zip(axes, sizes):
            scale[a], out[a] = ratios[a], int(size)
        return scale, out, {}
    pick = min if policy == b"not_larger" else max
    limit = pick(axes, key=lambda a: ratios[a])
    requested = dict(zip(axes, (int(v) for v in sizes)))
    for a in axes:
        scale[a], out[a] = ratios[limit], int(ratios[limit] * in_shape[a] + 0.5)      # ONNX: round half up
    return scale, out, {a: KeepAspect(in_shape[limit], requested[limit], requested[a]) for a in axes}


def axis_weights(node: onnx.NodeProto, opset: int, n: int, m: int, scale: float,
                 roi: tuple[float, float] | None, keep: KeepAspect | None = None) -> np.ndarray:
    """M [n, m]: output position o along this axis is sum_j M[j, o] * x[j] (zero columns where
    tf_crop_and_resize extrapolates). Computed by onnxruntime on the identity matrix."""
    if keep is not None:
        return _keep_aspect_weights(node, opset, n, m, keep)
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
    y = _run(g, opset, np.eye(n, dtype=np.float32))
    if y.shape != (n, m):
        raise ValueError(f"onnxruntime resizes {n} to {y.shape[1]} along this axis, shape inference says {m}")
    return y


def _keep_aspect_weights(node: onnx.NodeProto, opset: int, n: int, m: int, keep: KeepAspect) -> np.ndarray:
    """M [n, m] of an axis under keep_aspect_ratio_policy: the node's resize on x [n, 1, limit_in, n]
    (4-D: onnxruntime's cubic takes no 3-D input), x[j, 0, :, :] = e_j, over axes (2, 3) with the
    limiting axis's size on axis 2, so onnxruntime picks the same scale; x is constant along axis
    2 (interpolation weights sum to 1), so y[:, 0, 0, :] is M."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in WHOLE_TENSOR_ATTRS}
    sizes = numpy_helper.from_array(np.array([keep.limit_size, keep.size], np.int64), "sizes")
    g = helper.make_graph([helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], axes=[2, 3], **attrs)], "axis",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 1, keep.limit_in, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [sizes])
    x = np.broadcast_to(np.eye(n, dtype=np.float32)[:, None, None, :], (n, 1, keep.limit_in, n)).copy()
    y = _run(g, opset, x)
    if y.shape[3] != m or not np.allclose(y, y[:, :, :1, :], atol=1e-6):
        raise ValueError(f"onnxruntime's keep_aspect_ratio_policy resize of {n} gives {y.shape[3]}, "
                         f"shape inference says {m}")
    return y[:, 0, 0, :]


def _run(g: onnx.GraphProto, opset: int, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def lower(node: onnx.NodeProto, in_shape: tuple[int, ...], out_shape: tuple[int, ...], dtype, opset: int,
          consts: dict, e) -> list[onnx.NodeProto]:
    """The nodes computing `node`'s output. `consts`: values of roi/scales/sizes (absent = not
    given); `e`: the node emitter (fresh names, memoized constants) of the recurrent lowering.
    ValueError when onnxruntime's reading of the node disagrees with shape inference."""
    rank = len(in_shape)
    scale, out, keep = effective_scales(node, in_shape, consts.get("scales"), consts.get("sizes"))
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
    weights = {}
    for a in range(rank):
        if out[a] == in_shape[a] and scale[a] == 1.0 and not crop:
            continue
        M = axis_weights(node, opset, in_shape[a], out[a], scale[a], (roi[a], roi[rank + a]) if crop else None,
                         keep.get(a))
        if M.shape[0] == M.shape[1] and np.array_equal(M, np.eye(M.shape[0], dtype=M.dtype)):
            continue                                  # e.g. a crop of [0, 1] on the batch axis
        weights[a] = M
    x, inside = node.input[0], []
    for a in axis_order(list(weights), in_shape, out):
        x = along_axis(e, x, weights[a].astype(dtype), a, rank)
        inside.append((a, weights[a].sum(axis=0) != 0))
    ev = float(attr(node, "extrapolation_value", 0.0))
    if crop and ev != 0.0:
        mask = np.ones(out, bool)
        for a, ins in inside:
            mask &= ins.reshape([-1 if b == a else 1 for b in range(rank)])
        if not mask.all():
            x = e("Add", [x, e.const("extrapolate", np.where(mask, 0, ev).astype(dtype))])
    e("Identity", [x], node.output[0])
    return e.nodes


def axis_order(axes: list[int], in_shape: tuple[int, ...], out: list[int]) -> list[int]:
    """The order to resize `axes` in: the fewest elements written, counting those of a pass
    along the last axis LAST_AXIS_COST times (its gathers are scalar loads; along any other axis
    they copy whole rows). An upsample then resizes the last axis first, while the tensor is
    small: LR-ASPP's 8x bilinear upsample to [1, 21, 224, 224] gathered 1M elements along the
    last axis, and gathers 131K this way."""
    rank = len(in_shape)

    def cost(order) -> float:
        shape, total = list(in_shape), 0.0
        for a in order:
            shape[a] = out[a]
            total += float(np.prod(shape)) * (LAST_AXIS_COST if a == rank - 1 else 1.0)
        return total

    return list(min(itertools.permutations(axes), key=cost)) if len(axes) <= 4 else axes


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
