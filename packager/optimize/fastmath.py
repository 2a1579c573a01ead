"""Fast math: exp, erf, tanh and softmax become TVM's polynomial approximations (topi.fast_*).

libm's erff/tanhf/expf are scalar calls, so a vectorized GELU or softmax loop falls back to one
call per element; the approximations vectorize. Their error is far below the verify tolerance
(checked end to end by the pass-switch tests), but results are no longer bit-identical to libm:
`fastmath: false` keeps the exact functions.
"""
from __future__ import annotations

import tvm
from tvm import relax

from .base import PassReport

FAST = {"relax.exp", "relax.erf", "relax.tanh", "relax.nn.softmax"}


def _count(mod: tvm.IRModule) -> int:
    n = [0]

    def visit(e):
        if isinstance(e, relax.Call) and getattr(e.op, "name", None) in FAST:
            n[0] += 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return n[0]


def fastmath(mod: tvm.IRModule) -> tuple[tvm.IRModule, PassReport]:
    replaced = _count(mod)
    mod = relax.transform.FastMathTransform()(mod)
    return mod, PassReport("fastmath", "applied", f"{replaced} exp/erf/tanh/softmax call(s) -> fast approximations",
                           {"replaced": replaced})
