"""The kernel-call graph of a fused module's `main`: which call produces each value, who reads
it, and which values leave the model. Global fusion plans on this graph and outlines groups of
its calls (outline.py). Only kernels in block form can be fused: a kernel written as plain loops
(a recurrent layer's time loop) is not a call of the graph."""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax, tirx
from tvm.s_tir.stmt import SBlockRealize


@dataclass
class Call:
    """One `call_tir` binding of main."""

    index: int                      # position among main's bindings
    binding: relax.VarBinding
    func: tvm.ir.GlobalVar
    prim: tirx.PrimFunc
    args: list                      # relax.Var | relax.Constant, in the PrimFunc's parameter order

    @property
    def var(self) -> relax.Var:
        return self.binding.var

    @property
    def name(self) -> str:
        return self.func.name_hint

    @property
    def out_ty(self):
        return self.binding.value.ty if hasattr(self.binding.value, "ty") else self.var.ty


@dataclass
class KernelGraph:
    main: relax.Function
    bindings: list[relax.VarBinding]
    calls: dict[int, Call]                                  # binding index -> call_tir
    producer: dict[relax.Var, int] = field(default_factory=dict)   # var -> binding index
    consumers: dict[int, list[int]] = field(default_factory=dict)  # binding index -> readers
    returned: set[int] = field(default_factory=set)         # bindings whose value leaves main

    def reads(self, index: int) -> list[relax.Var]:
        """The main-level vars binding `index` reads, in order, without repeats."""
        seen, out = set(), []
        for v in relax.analysis.free_vars(self.bindings[index].value):
            if v in self.producer and v not in seen:
                seen.add(v)
                out.append(v)
        return out

    def call_inputs(self, index: int) -> list[int]:
        """Bindings whose values call `index` reads."""
        return [self.producer[v] for v in self.reads(index)]


def kernel_graph(mod: tvm.IRModule) -> KernelGraph | None:
    """The graph of main's bindings, or None when main is not one flat data-flow block (nothing
    to plan on; the pass then leaves the module alone)."""
    main = mod["main"]
    body = main.body
    if not isinstance(body, relax.SeqExpr) or len(body.blocks) != 1:
        return None
    bindings = list(body.blocks[0].bindings)
    if not all(isinstance(b, relax.VarBinding) for b in bindings):
        return None
    calls: dict[int, Call] = {}
    for i, b in enumerate(bindings):
        v = b.value
        if isinstance(v, relax.Call) and getattr(v.op, "name", None) == "relax.call_tir" and \
                isinstance(mod[v.args[0]].body, SBlockRealize):    # hand-written loops (recurrences) stay alone
            gv = v.args[0]
            calls[i] = Call(i, b, gv, mod[gv], list(v.args[1].fields))
    g = KernelGraph(main, bindings, calls)
    g.producer = {b.var: i for i, b in enumerate(bindings)}
    g.consumers = {i: [] for i in range(len(bindings))}
    for i in range(len(bindings)):
        for j in g.call_inputs(i):
            g.consumers[j].append(i)
    for v in relax.analysis.free_vars(body.body):
        if v in g.producer:
            g.returned.add(g.producer[v])
    return g
