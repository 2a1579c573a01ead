"""Graph simplification on Relax: fold BatchNorm into the preceding conv, fold constants, CSE,
and small constant powers as multiplies.

Folding BN into conv weights removes a four-constant normalization chain per conv and lets
the conv's epilogue be a single bias add; the math is exact up to float rounding. `x ** 2` and
`x ** 3` (variance and RMS norms, tanh-GELU) become `x * x` (exact) and `x * x * x`: TVM lowers
a power to a scalar powf call per element, half of GPT-2's GELU kernel.
"""
from __future__ import annotations

import tvm
from tvm import relax

from .base import PassReport
from .constfold import fold_constants
from .relax_util import count_ops, is_const, rewrite_functions

SMALL_POWERS = (2.0, 3.0)


@relax.expr_functor.mutator
class _Powers(relax.PyExprMutator):
    """relax.power(x, c) with c one constant 2 or 3 that does not change x's shape -> multiplies of x."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.rewritten = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.power" or not is_const(call.args[1]):
            return call
        x, c = call.args[0], call.args[1].value.numpy()
        if not str(x.ty.dtype).startswith("float") or c.size != 1 or c.dtype.kind != "f" or \
                c.flat[0] not in SMALL_POWERS or c.ndim > x.ty.ndim:
            return call
        self.rewritten += 1
        square = relax.op.multiply(x, x)
        return square if c.flat[0] == 2.0 else relax.op.multiply(self.builder_.emit(square), x)


def simplify(mod: tvm.IRModule) -> tuple[tvm.IRModule, PassReport]:
    before = count_ops(mod)
    powers = _Powers(mod)
    mod = rewrite_functions(powers, mod)
    mod, by_numpy = fold_constants(relax.transform.FoldBatchnormToConv2D()(mod))   # numpy first: TVM's
    mod = tvm.transform.Sequential([                                                # compiles every fold
        relax.transform.CanonicalizeBindings(),
        relax.transform.EliminateCommonSubexpr(),
        relax.transform.DeadCodeElimination(),
    ])(mod)
    after = count_ops(mod)
    folded_bn = before.get("relax.nn.batch_norm", 0) - after.get("relax.nn.batch_norm", 0)
    n_before, n_after = sum(before.values()), sum(after.values())
    return mod, PassReport("simplify", "applied",
                           f"{n_before} -> {n_after} graph ops; {folded_bn} BatchNorm folded into conv weights; "
                           f"{by_numpy} constant op(s) evaluated with numpy, the rest by TVM's FoldConstant; "
                           f"{powers.rewritten} power(s) of 2 or 3 as multiplies",
                           {"ops_before": n_before, "ops_after": n_after, "batchnorm_folded": folded_bn,
                            "constants_folded_numpy": by_numpy, "powers_as_multiplies": powers.rewritten})
