"""Relax utilities the graph passes share: run a mutator over every function, legalize graph ops
into PrimFuncs, find constants and PrimFuncs."""
from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir import expr as ir


@relax.expr_functor.mutator
class _SafeTake(relax.PyExprMutator):
    """ONNX Gather becomes relax.take in "fast" mode, which reads out of bounds (and crashes the
    process) on a bad index; "wrap" computes the same for every valid index, negative ones
    included, and stays in bounds for invalid ones."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) == "relax.take" and call.attrs.mode == "fast":
            return relax.op.take(call.args[0], call.args[1], call.attrs.axis, mode="wrap")
        return call


def rewrite_functions(m: relax.PyExprMutator, mod: tvm.IRModule) -> tvm.IRModule:
    """Run a Relax mutator (constructed over `mod`) on every Relax function of `mod`."""
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            m.builder_.update_func(gv, m.visit_expr(func))
    return m.builder_.get()


def safe_take(mod: tvm.IRModule) -> tvm.IRModule:
    return rewrite_functions(_SafeTake(mod), mod)


def legalize(mod: tvm.IRModule, custom: dict | None = None) -> tvm.IRModule:
    """Graph ops -> PrimFuncs (one per op) and constant folding; no fusion, no schedules.
    `custom` maps op names to our own legalizations (packed-layout convs)."""
    mod = safe_take(mod)
    seq = tvm.transform.Sequential([
        relax.transform.DecomposeOpsForInference(),
        relax.transform.LegalizeOps(custom),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.DeadCodeElimination(),
    ])
    return seq(mod)


def prim_funcs(mod: tvm.IRModule) -> dict[str, tvm.tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def bound_value(m: relax.PyExprMutator, e: relax.Expr) -> relax.Expr:
    """What the variable `e` is bound to in the function `m` is rewriting (e itself if it is not
    a bound variable)."""
    bound = m.lookup_binding(e) if isinstance(e, relax.Var) else None
    return e if bound is None else bound


def is_const(e) -> bool:
    return isinstance(e, (ir.GenericConst, ir.Constant)) and hasattr(e, "value") and hasattr(e.value, "numpy")


def count_ops(mod: tvm.IRModule) -> dict[str, int]:
    """Calls per graph op name in `main`."""
    counts: dict[str, int] = {}

    def visit(e):
        if isinstance(e, relax.Call) and hasattr(e.op, "name"):
            counts[e.op.name] = counts.get(e.op.name, 0) + 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return counts
