"""int8 execution of QDQ models (issue 47): a MatMul or Gemm whose activation is dequantized
from an 8-bit tensor (one scale and zero point) and whose weight is a dequantized constant
(8-bit, per-tensor or per-output-column scales) computes in integers:

    y = float(sum_k (x_q - x_zp) * (w_q - w_zp)) * (x_scale * w_scale)

(x_q - x_zp) is an int16 tensor, made where x_q is made (the producer's requantize epilogue
writes it), the weights minus their zero point are int8 panels in the package (a quarter of
their float32 size), the sum is exact in int32, and the float scale is the kernel's epilogue.
This is the formula onnxruntime's int8 kernels compute; the float path computed the same sum of
dequantized values with float32 rounding in every partial sum. The CPU int-dot rule
(schedule/rules/int_dot.py) schedules the kernel.

Not (yet) in integers, and counted in the report line by reason: matmuls of two activations
(attention), convolutions, weights whose zero point leaves int8 range, K odd or N not whole
panels. CUDA targets keep the float path (dp4a / integer tensor cores are not built).
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import tvm
from tvm import relax, te

from .base import PassReport
from .relax_util import is_const, rewrite_functions

PANEL = 8          # weight columns per panel: the int32 lanes of the CPU int-dot rule's vector
QUANTIZED = ("uint8", "int8")
CONVS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.nn.conv2d_transpose")


def pack_pairs(w: np.ndarray) -> np.ndarray:
    """K x N int8 -> [N/PANEL, K/2, PANEL, 2]: a panel's columns, k in pairs innermost."""
    k, n = w.shape
    return np.ascontiguousarray(w.reshape(k // 2, 2, n // PANEL, PANEL).transpose(2, 0, 3, 1))


def int_matmul(a: te.Tensor, panels: te.Tensor) -> te.Tensor:
    """C[..., m, n] = sum over k pairs of int32(A[..., m, k]) * int32(W[k, n]), W in pair panels."""
    kdim, n = int(a.shape[-1]), int(panels.shape[0]) * PANEL
    ko, ki = te.reduce_axis((0, kdim // 2), name="ko"), te.reduce_axis((0, 2), name="ki")
    return te.compute((*a.shape[:-1], n), lambda *i: te.sum(
        a[(*i[:-1], 2 * ko + ki)].astype("int32") * panels[i[-1] // PANEL, ko, i[-1] % PANEL, ki].astype("int32"),
        axis=[ko, ki]), name="matmul_int8")


def _scalar(e) -> np.ndarray | None:
    return e.value.numpy() if is_const(e) and e.value.numpy().size == 1 else None


@relax.expr_functor.mutator
class _IntegerMatmuls(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.integer = 0
        self.kept: Counter = Counter()          # why a dequantized matmul stayed in float

    def _bound(self, e):
        bound = self.lookup_binding(e) if isinstance(e, relax.Var) else None
        return e if bound is None else bound

    def _dequantized(self, e) -> relax.Call | None:
        v = self._bound(e)
        return v if isinstance(v, relax.Call) and getattr(v.op, "name", None) == "relax.dequantize" else None

    def _weight(self, e) -> tuple[np.ndarray, np.ndarray] | str:
        """(w_q - w_zp as int8 K x N, per-column scale) of a dequantized constant, or why not."""
        v, transposed = self._bound(e), False
        if isinstance(v, relax.Call) and getattr(v.op, "name", None) == "relax.permute_dims" and v.ty.ndim == 2 \
                and (v.attrs.axes is None or [int(a) for a in v.attrs.axes] == [1, 0]):
            v, transposed = v.args[0], True
        dq = self._dequantized(v)
        if dq is None:
            return "weight not dequantized"
        if not is_const(dq.args[0]):
            return "two activations"
        if not all(is_const(x) for x in dq.args[1:3]):
            return "weight scale computed at run time"
        q, scale, zp = (x.value.numpy() for x in dq.args[:3])
        if q.ndim != 2 or str(q.dtype) not in QUANTIZED:
            return "weight not a 2-D 8-bit constant"
        axis = int(dq.attrs.axis) % 2
        shape = [1, 1]
        shape[axis] = -1
        w = q.astype(np.int16) - zp.astype(np.int16).reshape(shape if zp.size > 1 else ())
        s = np.broadcast_to(scale.astype(np.float32).reshape(shape if scale.size > 1 else ()), q.shape)
        if transposed:
            w, s = w.T, s.T
        if not (s == s[:1]).all():
            return "weight scale varies along K"
        if w.min() < -128 or w.max() > 127:
            return "weight minus zero point leaves int8"
        return w.astype(np.int8), np.ascontiguousarray(s[0])

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        op = getattr(call.op, "name", None)
        if op in CONVS and self._dequantized(call.args[0]) is not None:
            self.kept["convolutions"] += 1
        if op != "relax.matmul" or str(call.ty.dtype) != "float32":
            return call
        x, w = self._dequantized(call.args[0]), self._weight(call.args[1])
        if x is None:
            if not isinstance(w, str):
                self.kept["activation not dequantized"] += 1
            return call
        if isinstance(w, str):
            self.kept[w] += 1
            return call
        why = self._unfit(x, w[0])
        if why:
            self.kept[why] += 1
            return call
        self.integer += 1
        return self._integer(x, *w)

    def _unfit(self, x: relax.Call, w: np.ndarray) -> str:
        x_scale, x_zp = _scalar(x.args[1]), _scalar(x.args[2])
        if x_scale is None or x_zp is None or str(x.args[0].ty.dtype) not in QUANTIZED:
            return "activation not per-tensor 8-bit"
        if x.args[0].ty.ndim < 2:
            return "activation not a matrix"
        k, n = w.shape
        return "K odd" if k % 2 else f"N not a multiple of {PANEL}" if n % PANEL else ""

    def _integer(self, x: relax.Call, w: np.ndarray, w_scale: np.ndarray) -> relax.Expr:
        bb = self.builder_
        xq, x_scale, x_zp = x.args[0], _scalar(x.args[1]), _scalar(x.args[2])
        xi = bb.emit(relax.op.astype(xq, "int16"))
        if int(x_zp.flat[0]):
            xi = bb.emit(relax.op.subtract(xi, relax.const(np.int16(x_zp.flat[0]), "int16")))
        acc = bb.emit_te(int_matmul, xi, relax.const(pack_pairs(w)), primfunc_name_hint="matmul_int8")
        scale = (np.float32(x_scale.flat[0]) * w_scale).astype(np.float32)
        return relax.op.multiply(bb.emit(relax.op.astype(acc, "float32")),
                                 relax.const(scale if scale.size > 1 and (scale != scale[0]).any()
                                             else np.float32(scale[0]), "float32"))


def integer_matmuls(mod: tvm.IRModule) -> tuple[tvm.IRModule, PassReport]:
    """The module with its QDQ matmuls in integers; the report counts them and the ones kept."""
    m = _IntegerMatmuls(mod)
    out = rewrite_functions(m, mod)
    kept = ", ".join(f"{n} {why}" for why, n in sorted(m.kept.items()))
    if not m.integer and not kept:
        return out, PassReport("int8", "applied", "no dequantized matmul or conv in the model", {"integer": 0})
    return out, PassReport("int8", "applied", f"{m.integer} matmul(s) in int8 (int32 sums, int8 weights)"
                           + (f"; kept in float: {kept}" if kept else ""),
                           {"integer": m.integer, "kept": dict(m.kept)})
