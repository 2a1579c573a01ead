"""Graph simplification on Relax: fold BatchNorm into the preceding conv, fold constants, CSE.

Folding BN into conv weights removes a four-constant normalization chain per conv and lets
the conv's epilogue be a single bias add; the math is exact up to float rounding.
"""
from __future__ import annotations

import tvm
from tvm import relax

from .base import PassReport
from .constfold import fold_constants
from .relax_util import count_ops


def simplify(mod: tvm.IRModule) -> tuple[tvm.IRModule, PassReport]:
    before = count_ops(mod)
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
                           f"{by_numpy} constant op(s) evaluated with numpy, the rest by TVM's FoldConstant",
                           {"ops_before": n_before, "ops_after": n_after, "batchnorm_folded": folded_bn,
                            "constants_folded_numpy": by_numpy})
