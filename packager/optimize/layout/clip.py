"""TVM's ONNX importer emits Clip (ReLU6 in MobileNets) as pre-lowered TIR (`call_tir` of
topi.maximum / topi.minimum), which layout propagation cannot see through: every ReLU6 would
need a conversion on each side. This rewrite turns those calls back into relax.maximum /
relax.minimum with the same scalar bound (identical math), before layouts are chosen; the
legalization runs it again for every target, so Clip gets ieee.py's NaN rule everywhere.
relax.clip itself (the importer's HardSigmoid and HardSwish) has no layout rule either: it
becomes the same maximum / minimum pair (PP-LCNet's 11 HardSwishes each cost a layout
conversion and two kernels of their own). relax.nn.leakyrelu has no layout rule in TVM 0.27
either: it becomes maximum(x, alpha * x) for 0 <= alpha <= 1, else maximum(x, 0) +
alpha * minimum(x, 0), both exact (speechmos' AECMOS: each of its four Conv -> LeakyRelu ->
MaxPool stages went back to NCHW after the conv). relax.nn.prelu has a layout rule that refuses
channel blocks: it becomes the same ops with its per-channel slopes as a broadcast constant
(MTCNN's ONet converted back to NCHW and again after each of its four Conv -> PRelu stages)."""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from ..relax_util import is_const, rewrite_functions

BLOCKS = {"T_maximum": relax.op.maximum, "T_minimum": relax.op.minimum}


def _scalar_bound_op(func) -> object | None:
    """relax.op.maximum/minimum if `func` is topi's element-wise max/min (one T_maximum or
    T_minimum block over two inputs and one output)."""
    if not isinstance(func, tirx.PrimFunc) or len(func.params) != 3:
        return None
    names: list[str] = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, lambda b: names.append(b.name_hint)), order="post")
    names = [n for n in names if n != "root"]
    return BLOCKS.get(names[0]) if len(names) == 1 else None


@relax.expr_functor.mutator
class _ClipAsOps(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.mod_ = mod
        self.rewritten = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) == "relax.clip":
            return self._clip(call)
        if getattr(call.op, "name", None) == "relax.nn.leakyrelu":
            return self._leaky(call)
        if getattr(call.op, "name", None) == "relax.nn.prelu":
            return self._prelu(call)
        if getattr(call.op, "name", None) != "relax.call_tir" or not isinstance(call.args[0], tvm.ir.GlobalVar):
            return call
        op = _scalar_bound_op(self.mod_[call.args[0]])
        if op is None or len(call.args[1].fields) != 2:
            return call
        x, bound = call.args[1].fields
        if getattr(bound.ty, "ndim", None) != 0 or x.ty.dtype != bound.ty.dtype:
            return call
        self.rewritten += 1
        return op(x, bound)

    def _clip(self, call):
        """relax.clip(x, lo, hi) with constant bounds on a float x -> minimum(maximum(x, lo), hi)."""
        x, lo, hi = call.args
        dtype = str(x.ty.dtype)
        bounds = [b if isinstance(b, (tirx.IntImm, tirx.FloatImm)) else getattr(b, "value", None) for b in (lo, hi)]
        if not dtype.startswith("float") or not all(isinstance(b, (tirx.IntImm, tirx.FloatImm)) for b in bounds):
            return call
        self.rewritten += 1
        low = self.builder_.emit(relax.op.maximum(x, relax.const(float(bounds[0].value), dtype)))
        return relax.op.minimum(low, relax.const(float(bounds[1].value), dtype))

    def _leaky(self, call):
        """relax.nn.leakyrelu(x, alpha) on a float x as maximum / minimum / multiply / add."""
        x, alpha = call.args[0], float(call.attrs.alpha)
        dtype = str(x.ty.dtype)
        if not dtype.startswith("float"):
            return call
        self.rewritten += 1
        return self._slope(x, relax.const(alpha, dtype), 0.0 <= alpha <= 1.0)

    def _prelu(self, call):
        """relax.nn.prelu(x, slopes, axis) on a float x: the slopes broadcast along `axis`."""
        x, slopes = call.args
        dtype, rank, axis = str(x.ty.dtype), x.ty.ndim, int(call.attrs.axis)
        if not dtype.startswith("float") or rank < 1 or getattr(slopes.ty, "ndim", None) != 1:
            return call
        axis = axis % rank
        shape = [1] * rank
        shape[axis] = -1
        self.rewritten += 1
        if is_const(slopes):
            values = slopes.value.numpy()
            between = bool(((values >= 0) & (values <= 1)).all())
            return self._slope(x, relax.const(values.reshape(shape), dtype), between)
        return self._slope(x, self.builder_.emit(relax.op.reshape(slopes, shape)), False)

    def _slope(self, x, a, between: bool):
        """x where x >= 0, a * x below: max(x, a * x) when 0 <= a <= 1 (a * x lies between x and
        0), else max(x, 0) + a * min(x, 0); both exact."""
        if between:
            return relax.op.maximum(x, self.builder_.emit(relax.op.multiply(x, a)))
        zero = relax.const(0.0, str(x.ty.dtype))
        pos = self.builder_.emit(relax.op.maximum(x, zero))
        neg = self.builder_.emit(relax.op.multiply(self.builder_.emit(relax.op.minimum(x, zero)), a))
        return relax.op.add(pos, neg)


def clip_as_ops(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    m = _ClipAsOps(mod)
    out = relax.transform.DeadCodeElimination()(rewrite_functions(m, mod))
    return out, m.rewritten
