"""ONNX's NaN and infinity semantics for Relu, Clip, Max and Min (what onnxruntime computes).

TVM lowers a float max(a, b) to `a > b ? a : b` on CPUs (a NaN in `a` gives `b`) but to
fmaxf/fminf in CUDA and OpenCL, which return the other operand when either is NaN. So every
float relu/maximum/minimum here is written as that select itself, `a > b ? a : b` (`<` for min),
with the operand that may be NaN second: a NaN there fails the compare and comes through, on
every target, at the cost of max itself (LLVM matches the select to maxps/fmax). A constant or
0-d operand (relu's zero, Clip's bound) goes first, so the tensor's NaN is kept for free;
between two tensors one isnan test keeps a NaN in the first. TVM's importer writes ONNX Max/Min
as a reduction over a stack of its inputs (a NaN survives only in the last one) and Clip with
bounds as TOPI maximum/minimum kernels: both become binary maximum/minimum first
(variadic.py, layout/clip.py's `clip_as_ops`), so the rule reaches them on every target.
Other dtypes keep TVM's own lowering.
"""
from __future__ import annotations

import tvm
from tvm import relax, te, topi

from .relax_util import is_const

FLOATS = ("float16", "float32", "float64")


def _default(op: str):
    return tvm.ir.Op.get(op).get_attr("FLegalize")


def _relu(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    x = call.args[0]
    if str(x.ty.dtype) not in FLOATS:
        return _default("relax.nn.relu")(bb, call)

    def compute(t):
        zero = tvm.tirx.const(0, t.dtype)
        return te.compute(t.shape, lambda *i: _select("maximum", zero, t(*i)), name="compute",
                          tag=topi.tag.ELEMWISE)

    return bb.call_te(compute, x, primfunc_name_hint="relu")


# Per float type: the integer type of its bits, the bits without the sign, and infinity's bits.
_NAN_BITS = {"float16": ("int16", 0x7FFF, 0x7C00), "float32": ("int32", 0x7FFFFFFF, 0x7F800000),
             "float64": ("int64", 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000)}


def is_nan(v) -> tvm.tirx.PrimExpr:
    """True for NaN only: its bits without the sign exceed infinity's. Neither tirx.isnan (TVM's
    LLVM code generator lowers it one lane at a time, and LLVM then scalarized whole fused
    epilogues around it: a conv with a NaN-keeping SiLU ran 5x slower) nor v != v (TVM's
    simplifier folds it to false)."""
    dtype = v.dtype if hasattr(v, "dtype") else v.ty          # a te TensorSlice, or a PrimExpr
    ints, magnitude, inf = _NAN_BITS[str(dtype)]
    bits = tvm.tirx.reinterpret(ints, v)
    return tvm.tirx.bitwise_and(bits, tvm.tirx.const(magnitude, ints)) > tvm.tirx.const(inf, ints)


def _select(name: str, a, b):
    """max/min(a, b) as `a > b ? a : b` (`<` for min): a NaN in `b` comes through on every target."""
    return tvm.tirx.Select(a > b if name == "maximum" else a < b, a, b)


def _binary(name: str):
    """relax.maximum / relax.minimum: a constant operand goes first; between two tensors a NaN on
    either side is kept."""
    op = f"relax.{name}"

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        a, b = call.args
        if str(a.ty.dtype) not in FLOATS or str(b.ty.dtype) != str(a.ty.dtype):
            return _default(op)(bb, call)
        constant = _scalar(a) or _scalar(b)      # a constant or 0-d bound (Clip's, once layout/clip.py ran)
        if _scalar(a):
            a, b = b, a                          # the tensor first here; its pair picks below

        def compute(x, y):
            shape = _broadcast([int(d) for d in x.shape], [int(d) for d in y.shape])

            def value(*i):
                u, v = _at(x, i, shape), _at(y, i, shape)
                if constant:
                    return _select(name, v, u)   # constant first: a NaN in the tensor comes through
                return tvm.tirx.Select(is_nan(u), u, _select(name, u, v))

            return te.compute(shape, value, name=f"T_{name}", tag=topi.tag.BROADCAST)

        return bb.call_te(compute, a, b, primfunc_name_hint=name)

    return legalize


def _scalar(e) -> bool:
    return is_const(e) or getattr(e.ty, "ndim", None) == 0


def _broadcast(s1: list[int], s2: list[int]) -> list[int]:
    n = max(len(s1), len(s2))
    a, b = [1] * (n - len(s1)) + s1, [1] * (n - len(s2)) + s2
    return [max(x, y) for x, y in zip(a, b)]


def _at(t, idx, shape: list[int]):
    """t read at the output index `idx` under numpy broadcasting."""
    k = len(shape) - len(t.shape)
    return t(*[0 if int(d) == 1 and shape[k + j] != 1 else idx[k + j] for j, d in enumerate(t.shape)])


LEGALIZATIONS = {"relax.nn.relu": _relu,
                 "relax.maximum": _binary("maximum"), "relax.minimum": _binary("minimum")}
