"""Data movement on 8-bit values in QDQ models (part of the `int8` pass).

A QDQ model brackets every op with QuantizeLinear -> DequantizeLinear, also the ops that only
move values: a ShuffleNet channel shuffle is concat -> Q/DQ -> reshape -> Q/DQ -> transpose ->
Q/DQ -> reshape -> Q/DQ -> split, each step rounding float32 maps it has just dequantized. Such
an op neither computes nor reorders magnitudes (max pooling only picks), so with one scale and
zero point on both sides

    quantize(move(dequantize(x_q, s, z)), s, z) == move(x_q)

exactly: dequantize then quantize with the same parameters gives x_q back. The quantize is
replaced by the move on the 8-bit tensor (a chain of moves, concat inputs and split outputs
included), as onnxruntime's QDQ transformers do, and the float ops it read go dead. The next
DequantizeLinear stays, so the int8 pass (optimize/int8.py) finds its 8-bit input as before.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .relax_util import bound_value, is_const

# Ops that move or select values without computing new ones (max pooling picks one of them).
MOVES = {"relax.reshape", "relax.permute_dims", "relax.concat", "relax.split", "relax.strided_slice",
         "relax.squeeze", "relax.expand_dims", "relax.flatten", "relax.nn.max_pool1d", "relax.nn.max_pool2d"}


def _params(scale, zero_point, dtype: str) -> tuple | None:
    """A hashable key of per-tensor quantization parameters, or None unless both are scalar constants."""
    if not (is_const(scale) and is_const(zero_point)):
        return None
    s, z = scale.value.numpy(), zero_point.value.numpy()
    if s.size != 1 or z.size != 1:
        return None
    return float(np.float32(s.flat[0])), int(z.flat[0]), dtype


@relax.expr_functor.mutator
class EightBitMoves(relax.PyExprMutator):
    """Replaces quantize(moves(dequantize(x_q))) with moves(x_q) where the parameters match;
    `moved` counts the quantizes replaced, `ops` the moves now on 8-bit values."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.moved = 0
        self.ops = 0
        self.cache: dict[tuple, relax.Expr] = {}

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.quantize":
            return call
        key = _params(call.args[1], call.args[2], str(call.attrs.out_dtype))
        low = self._eight_bit(call.args[0], key) if key else None
        if low is None:
            return call
        self.moved += 1
        return low

    def _eight_bit(self, e: relax.Expr, key: tuple) -> relax.Expr | None:
        """An expression with e's values quantized by `key`, made of moves of an 8-bit tensor
        dequantized with `key`; None if e is not such a chain."""
        memo = (e, key) if isinstance(e, relax.Var) else None
        if memo is not None and memo in self.cache:
            return self.cache[memo]
        v = bound_value(self, e)
        out = None
        if isinstance(v, relax.TupleGetItem):
            src = self._eight_bit(v.tuple_value, key)
            out = None if src is None else self.builder_.emit(relax.TupleGetItem(src, v.index))
        elif isinstance(v, relax.Tuple):
            fields = [self._eight_bit(f, key) for f in v.fields]
            out = None if any(f is None for f in fields) else relax.Tuple(fields)
        elif isinstance(v, relax.Call) and getattr(v.op, "name", None) == "relax.dequantize":
            if _params(v.args[1], v.args[2], str(v.args[0].ty.dtype)) == key:
                out = v.args[0]
        elif isinstance(v, relax.Call) and getattr(v.op, "name", None) in MOVES:
            src = self._eight_bit(v.args[0], key)
            if src is not None:
                self.ops += 1
                out = self.builder_.emit(relax.Call(v.op, [src, *v.args[1:]], v.attrs))
        if memo is not None and out is not None:
            self.cache[memo] = out
        return out
