"""CumSum and TopK written in operators that compile to plain kernels.

TVM lowers both to calls into its runtime library (a scan and a sort), which the standalone
runtime does not carry. With static shapes neither needs them:

* CumSum along an axis of length n is a product with a constant n x n triangular matrix of ones
  (inclusive/exclusive, forward/reverse pick the triangle): one MatMul, or a few weighted Gathers
  for n <= 4 (resize.along_axis). O(n) work per output instead of O(1), so axes longer than
  CUMSUM_MAX_LENGTH stay in ONNX Runtime.
* TopK with a constant k is k rounds of ArgMax (ArgMin for largest=0) along the axis, each taking
  the element out of the running tensor (Where with -inf/+inf at that index): ties resolve to the
  lower index as ONNX requires, the result is sorted (allowed for sorted=0). k above TOPK_MAX_K
  stays in ONNX Runtime. Known deviation: where the tensor itself holds -inf (+inf for
  largest=0; the type's min/max for integers) among the k selected, a taken index can be chosen
  again.
"""
from __future__ import annotations

import numpy as np
import onnx

from .attrs import attr
from .resize import along_axis

CUMSUM_MAX_LENGTH = 4096
TOPK_MAX_K = 32


def cumsum_matrix(n: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """M [n, n] with out[o] = sum_j M[j, o] x[j]."""
    j, o = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    if reverse:
        return (j > o) if exclusive else (j >= o)
    return (j < o) if exclusive else (j <= o)


def cumsum(node: onnx.NodeProto, shape: tuple[int, ...], axis: int, dtype, e) -> list[onnx.NodeProto]:
    axis %= len(shape)
    M = cumsum_matrix(shape[axis], bool(attr(node, "exclusive", 0)), bool(attr(node, "reverse", 0)))
    e("Identity", [along_axis(e, node.input[0], M.astype(dtype), axis, len(shape))], node.output[0])
    return e.nodes


def topk(node: onnx.NodeProto, shape: tuple[int, ...], k: int, dtype, e) -> list[onnx.NodeProto]:
    rank = len(shape)
    axis = attr(node, "axis", -1) % rank
    largest = attr(node, "largest", 1)
    pick = "ArgMax" if largest else "ArgMin"
    taken = np.array(-np.inf if largest else np.inf, dtype) if np.issubdtype(dtype, np.floating) else \
        np.array(np.iinfo(dtype).min if largest else np.iinfo(dtype).max, dtype)
    iota = np.arange(shape[axis], dtype=np.int64).reshape([-1 if b == axis else 1 for b in range(axis, rank)])
    x, values, indices = node.input[0], [], []
    for r in range(k):
        idx = e(pick, [x], axis=axis, keepdims=1)
        values.append(e("GatherElements", [x, idx], axis=axis))
        indices.append(idx)
        if r + 1 < k:
            hit = e("Equal", [e.const("iota", iota), idx])
            x = e("Where", [hit, e.const("taken", taken), x])
    outs = list(node.output) + ["", ""]
    for out, parts in ((outs[0], values), (outs[1], indices)):
        if out:
            e("Concat", parts, out, axis=axis) if len(parts) > 1 else e("Identity", parts, out)
    return e.nodes
