"""ONNX's variadic Max, Min, Sum and Mean as chains of binary ops.

TVM's importer writes them as a reduction over axis 0 of stack(broadcast_to(a), broadcast_to(b),
...): the stack copies every input into a new tensor, ConvertLayout has no rule for it (a
ShuffleNet's residual Sums ran in NCHW behind conversions), and the max/min reduction keeps a
NaN only when it comes last. A chain of relax.maximum/minimum/add (Mean: then a division by the
count) computes the same values in the same order, broadcasts by itself, and reaches ieee.py's
NaN rule for max/min.
"""
from __future__ import annotations

import tvm
from tvm import relax

from .relax_util import rewrite_functions

BINARY = {"relax.max": relax.op.maximum, "relax.min": relax.op.minimum, "relax.sum": relax.op.add,
          "relax.mean": relax.op.add}


@relax.expr_functor.mutator
class _Variadic(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        op = getattr(call.op, "name", "")
        if op not in BINARY or call.attrs.keepdims or list(call.attrs.axis or []) != [0]:
            return call
        stacked = self.lookup_binding(call.args[0]) if isinstance(call.args[0], relax.Var) else call.args[0]
        if getattr(getattr(stacked, "op", None), "name", "") != "relax.stack" or int(stacked.attrs.axis) != 0:
            return call
        parts = stacked.args[0]
        parts = self.lookup_binding(parts) if isinstance(parts, relax.Var) else parts
        if not isinstance(parts, relax.Tuple) or len(parts.fields) < 2:
            return call
        fields = [self._unbroadcast(f) for f in parts.fields]
        out = fields[0]
        for f in fields[1:]:
            out = self.builder_.normalize(BINARY[op](out, f))
        if op == "relax.mean":
            dtype = str(call.ty.dtype)
            out = self.builder_.normalize(relax.op.divide(out, relax.const(len(fields), dtype)))
        return out

    def _unbroadcast(self, e):
        """broadcast_to(a) -> a: the binary ops broadcast by themselves (and a constant stays one)."""
        bound = self.lookup_binding(e) if isinstance(e, relax.Var) else e
        if getattr(getattr(bound, "op", None), "name", "") == "relax.broadcast_to":
            return bound.args[0]
        return e


def variadic_to_binary(mod: tvm.IRModule) -> tvm.IRModule:
    """Rewrite the importer's stacked Max/Min/Sum/Mean into chains of binary ops (see _Variadic)."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(_Variadic(mod), mod))
