"""TVM's ONNX importer emits Clip (ReLU6 in MobileNets) as pre-lowered TIR (`call_tir` of
topi.maximum / topi.minimum), which layout propagation cannot see through: every ReLU6 would
need a conversion on each side. This rewrite turns those calls back into relax.maximum /
relax.minimum with the same scalar bound (identical math), before layouts are chosen; the
legalization runs it again for every target, so Clip gets ieee.py's NaN rule everywhere.
relax.clip itself (the importer's HardSigmoid and HardSwish) has no layout rule either: it
becomes the same maximum / minimum pair (PP-LCNet's 11 HardSwishes each cost a layout
conversion and two kernels of their own)."""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from ..relax_util import rewrite_functions

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


def clip_as_ops(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    m = _ClipAsOps(mod)
    out = relax.transform.DeadCodeElimination()(rewrite_functions(m, mod))
    return out, m.rewritten
