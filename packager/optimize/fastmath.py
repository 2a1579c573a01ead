"""Fast math: exp, erf, tanh, sigmoid, SiLU, GELU and softmax computed with TVM's polynomial
approximations (topi.fast_*) instead of libm.

libm's expf/erff/tanhf are scalar calls, so a vectorized sigmoid, GELU or softmax loop falls
back to one call per element; the approximations vectorize (a sigmoid over 100k floats: 0.28 ms
with expf, 0.03 ms with fast_exp, one core, AMD EPYC). Every SiLU conv of a YOLO paid that in
its epilogue. Softmax (a reduction nothing propagates a layout through) is rewritten on the
graph; the element-wise functions stay graph ops until legalization (`LEGALIZATIONS`), so the
layout pass still carries a packed layout through them. A NaN input stays NaN, as in onnxruntime.
Their error is far below the verify tolerance (checked end to end by the pass-switch tests), but
results are no longer bit-identical to libm: `fastmath: false` keeps the exact functions.
"""
from __future__ import annotations

from typing import Callable

import tvm
from tvm import relax, te, topi

from .base import PassReport
from .ieee import is_nan
from .relax_util import rewrite_functions


def _fast_sigmoid(x: te.Tensor) -> te.Tensor:
    e = topi.fast_exp(topi.negative(x))
    one = tvm.tirx.const(1, x.dtype)
    return te.compute(x.shape, lambda *i: one / (one + e(*i)), name="T_sigmoid", tag=topi.tag.ELEMWISE)


def fast_silu(x: te.Tensor) -> te.Tensor:
    """x * sigmoid(x) with the fast sigmoid; also the layout search's stand-in for any
    transcendental epilogue of a conv."""
    s = _fast_sigmoid(x)
    return te.compute(x.shape, lambda *i: x(*i) * s(*i), name="T_silu", tag=topi.tag.ELEMWISE)


def _fast_gelu(x: te.Tensor) -> te.Tensor:
    """0.5 x (1 + erf(x / sqrt 2)), as relax.nn.gelu's own legalization, with fast_erf."""
    e = topi.fast_erf(topi.multiply(x, tvm.tirx.const(0.7071067811865476, x.dtype)))
    half, one = tvm.tirx.const(0.5, x.dtype), tvm.tirx.const(1, x.dtype)
    return te.compute(x.shape, lambda *i: half * x(*i) * (one + e(*i)), name="T_gelu", tag=topi.tag.ELEMWISE)


def _fast_gelu_tanh(x: te.Tensor) -> te.Tensor:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) with fast_tanh."""
    c, k = tvm.tirx.const(0.7978845608028654, x.dtype), tvm.tirx.const(0.044715, x.dtype)
    inner = te.compute(x.shape, lambda *i: c * (x(*i) + k * x(*i) * x(*i) * x(*i)), name="T_inner",
                       tag=topi.tag.ELEMWISE)
    t = topi.fast_tanh(inner)
    half, one = tvm.tirx.const(0.5, x.dtype), tvm.tirx.const(1, x.dtype)
    return te.compute(x.shape, lambda *i: half * x(*i) * (one + t(*i)), name="T_gelu_tanh", tag=topi.tag.ELEMWISE)


FAST: dict[str, Callable[[te.Tensor], te.Tensor]] = {
    "relax.exp": topi.fast_exp, "relax.erf": topi.fast_erf, "relax.tanh": topi.fast_tanh,
    "relax.sigmoid": _fast_sigmoid, "relax.nn.silu": fast_silu, "relax.nn.gelu": _fast_gelu,
    "relax.nn.gelu_tanh": _fast_gelu_tanh,
}


def _keep_nan(fast: Callable[[te.Tensor], te.Tensor]) -> Callable[[te.Tensor], te.Tensor]:
    """fast(x) where x is a number, x where it is NaN (the approximations clamp their input)."""

    def compute(x: te.Tensor) -> te.Tensor:
        y = fast(x)
        return te.compute(x.shape, lambda *i: tvm.tirx.Select(is_nan(x(*i)), x(*i), y(*i)),
                          name="T_fast", tag=topi.tag.ELEMWISE)

    return compute


def _legalization(op: str):
    fast = _keep_nan(FAST[op])

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        x = call.args[0]
        if not str(x.ty.dtype).startswith("float"):
            return tvm.ir.Op.get(op).get_attr("FLegalize")(bb, call)
        return bb.call_te(fast, x, primfunc_name_hint="fast_" + op.split(".")[-1])

    return legalize


# Used by the legalize step when the pass is on.
LEGALIZATIONS = {op: _legalization(op) for op in FAST}


@relax.expr_functor.mutator
class _FastSoftmax(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) == "relax.nn.softmax":
            return self.builder_.call_te(topi.nn.fast_softmax, call.args[0], call.attrs.axis)
        return call


def _count(mod: tvm.IRModule, ops: set[str]) -> int:
    n = [0]

    def visit(e):
        if isinstance(e, relax.Call) and getattr(e.op, "name", None) in ops:
            n[0] += 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return n[0]


def fastmath(mod: tvm.IRModule) -> tuple[tvm.IRModule, PassReport]:
    """Softmax -> fast_softmax now; the element-wise functions are counted here and lowered fast
    by the legalize step (`LEGALIZATIONS`)."""
    softmax, elementwise = _count(mod, {"relax.nn.softmax"}), _count(mod, set(FAST))
    mod = rewrite_functions(_FastSoftmax(mod), mod)
    return mod, PassReport("fastmath", "applied", f"{softmax} softmax call(s) -> fast_softmax; {elementwise} "
                           "exp/erf/tanh/sigmoid/silu/gelu call(s) lowered to fast approximations",
                           {"softmax": softmax, "elementwise": elementwise, "replaced": softmax + elementwise})
