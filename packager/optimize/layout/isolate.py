"""Keeping a layout failure local to the op that causes it.

TVM's ConvertLayout raises for the whole module when one op's layout inference fails (TVM 0.27's
`relax.stack` over a 3-D tensor, which DNSMOS's spectrogram front end has, raises "Invalid
SLayout" even when every conv keeps NCHW), and the layout pass then kept NCHW for every conv of
the model. Here the op types whose inference fails are found and lowered to kernels before
ConvertLayout runs: a `call_tir` has no layout inference, so ConvertLayout converts its inputs
back to their initial layout and the rest of the model keeps its packed layouts.

Lowering uses the same legalizations as the pipeline's legalize step (the caller passes them),
so the kernels compute what they would have computed one pass later.
"""
from __future__ import annotations

from typing import Callable

import tvm
from tvm import relax

from ..relax_util import rewrite_functions

# never lowered early: the op whose layouts are chosen, and the conversions themselves
KEPT = ("relax.nn.conv2d", "relax.layout_transform")

@relax.expr_functor.mutator
class _Lower(relax.PyExprMutator):
    """Replace every call of the given op types by its legalized kernel call."""

    def __init__(self, mod: tvm.IRModule, ops: set[str], custom: dict):
        super().__init__(mod)
        self.ops, self.custom = ops, custom

    def visit_call_(self, call):
        call = super().visit_call_(call)
        name = getattr(call.op, "name", None)
        if name not in self.ops:
            return call
        rule = self.custom.get(name) or tvm.ir.Op.get(name).get_attr("FLegalize")
        return rule(self.builder_, self.builder_.normalize(call))


def op_types(mod: tvm.IRModule) -> list[str]:
    """Op names called in `mod`'s Relax functions that could be lowered early, in first-use order."""
    seen: dict[str, None] = {}
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, lambda e: seen.setdefault(e.op.name, None) if isinstance(
                e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name not in KEPT
                and tvm.ir.Op.get(e.op.name).get_attr("FLegalize") is not None else None)
    return list(seen)


def lower_ops(mod: tvm.IRModule, ops: list[str], custom: dict) -> tvm.IRModule:
    """`mod` with every call of `ops` lowered to a kernel call."""
    return rewrite_functions(_Lower(mod, set(ops), custom), mod) if ops else mod


def isolate(mod: tvm.IRModule, converts: Callable[[tvm.IRModule], bool], custom: dict
            ) -> tuple[tvm.IRModule | None, list[str]]:
    """(the module with some op types lowered to kernels, those types) when that lets the layout
    conversion succeed (`converts`); (None, []) when even lowering every candidate does not. As
    few types as possible are lowered: each is tried back in the graph, and stays there when the
    conversion still works."""
    candidates = op_types(mod)
    if not candidates or not converts(lower_ops(mod, candidates, custom)):
        return None, []
    needed = list(candidates)
    for op in candidates:
        rest = [o for o in needed if o != op]
        if converts(lower_ops(mod, rest, custom)):
            needed = rest
    return lower_ops(mod, needed, custom), needed
