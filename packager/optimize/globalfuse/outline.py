"""Outline groups of kernel calls into one kernel: each group becomes a private Relax function
marked Primitive (what FuseOps produces), and TVM's FuseTIR merges its PrimFuncs into one.

A call may sit in several groups (a layout copy folded into each of its consumers is recomputed
there). The rebuilt `main` keeps every binding no group replaces, in an order that respects the
data flow.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax, tirx

from ...errors import InternalError
from .graph import KernelGraph


@dataclass(frozen=True)
class Group:
    """Calls (binding indices, in data-flow order) to merge, and the ones whose values leave it."""

    name: str
    members: tuple[int, ...]
    outputs: tuple[int, ...]
    anchor: int                      # the kernel the others fold into (its schedule must survive)


def outline(mod: tvm.IRModule, g: KernelGraph, groups: list[Group]) -> tvm.IRModule:
    """Replace each group by one call of its merged kernel. A member that is no group's output
    and no longer read outside the groups leaves main. Returns the module after FuseTIR + DCE."""
    bb = relax.BlockBuilder(mod.clone())   # the caller's module is shared (other targets, profiles)
    funcs = [_outline_one(bb, g, grp) for grp in groups]
    mod = bb.get()
    absorbed = {i for grp in groups for i in grp.members}
    _check_nothing_lost(g, groups, absorbed)
    main = g.main
    block = relax.DataflowBlock(_rebuilt_bindings(g, groups, funcs, absorbed))
    new_main = relax.Function(main.params, relax.SeqExpr([block], main.body.body), main.ret_ty,
                              main.is_pure, main.attrs)
    mod.update_func(mod.get_global_var("main"), new_main)
    return tvm.transform.Sequential([
        relax.transform.Normalize(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
    ])(mod)


def _check_nothing_lost(g: KernelGraph, groups: list[Group], absorbed: set[int]) -> None:
    """A member that leaves main must not be read by anything outside the groups (a planner bug
    would otherwise drop a value silently)."""
    outputs = {i for grp in groups for i in grp.outputs}
    for i in absorbed - outputs:
        outside = [r for r in g.consumers[i] if r not in absorbed]
        if outside or i in g.returned:
            raise InternalError(f"global_fusion: {g.bindings[i].var.name} is still read outside its group")


def _outline_one(bb: relax.BlockBuilder, g: KernelGraph, grp: Group) -> tuple[tvm.ir.GlobalVar, list]:
    """Emit the group's Primitive function; returns its GlobalVar and the arguments main passes."""
    inside = set(grp.members)
    outer: list = []                         # main-level values the group reads (vars and constants)
    params: list[relax.Var] = []

    def param_for(arg) -> relax.Var:
        for o, p in zip(outer, params):
            if o.same_as(arg):
                return p
        params.append(relax.Var(f"p{len(params)}", arg.ty))
        outer.append(arg)
        return params[-1]

    def is_inside(arg) -> bool:
        return isinstance(arg, relax.Var) and g.producer.get(arg) in inside

    for i in grp.members:
        for a in _member_args(g, i):
            if not is_inside(a):
                param_for(a)
    with bb.function(grp.name, params, attrs={"Primitive": True}, private=True):
        with bb.dataflow():
            local: dict[int, relax.Var] = {}
            for i in grp.members:
                args = [local[g.producer[a]] if is_inside(a) else param_for(a) for a in _member_args(g, i)]
                if i in g.calls:
                    ty = g.calls[i].var.ty
                    out_ty = list(ty.fields) if isinstance(ty, relax.TupleType) else ty
                    local[i] = bb.emit(relax.call_tir(g.calls[i].func, args, out_ty))
                else:                                         # an item of a multi-output call
                    local[i] = bb.emit(relax.TupleGetItem(args[0], g.bindings[i].value.index))
            outs = [local[i] for i in grp.outputs]
            result = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        gv = bb.emit_func_output(result)
    return gv, outer


def _member_args(g: KernelGraph, i: int) -> list:
    if i in g.calls:
        return g.calls[i].args
    value = g.bindings[i].value
    if not isinstance(value, relax.TupleGetItem):
        raise ValueError(f"global_fusion: binding {g.bindings[i].var.name} cannot join a group")
    return [value.tuple_value]


def _rebuilt_bindings(g: KernelGraph, groups: list[Group], funcs: list, absorbed: set[int]) -> list:
    """Main's bindings with each group as one call, each unit emitted once all it reads exists
    (in the original order otherwise)."""
    units = [("keep", i, i) for i in range(len(g.bindings)) if i not in absorbed]
    units += [("group", k, min(grp.members)) for k, grp in enumerate(groups)]
    units.sort(key=lambda u: (u[2], u[0] == "keep"))
    defined: set = set()
    bindings: list = []
    while units:
        for pos, u in enumerate(units):
            reads = g.reads(u[1]) if u[0] == "keep" else [a for a in funcs[u[1]][1] if a in g.producer]
            if all(v in defined for v in reads):
                break
        else:
            raise RuntimeError("global_fusion: the outlined groups form a cycle")
        units.pop(pos)
        new = [g.bindings[u[1]]] if u[0] == "keep" else _group_bindings(g, groups[u[1]], *funcs[u[1]])
        bindings += new
        defined |= {b.var for b in new}
    return bindings


def _group_bindings(g: KernelGraph, grp: Group, gv: tvm.ir.GlobalVar, args: list) -> list:
    outs = [g.bindings[i].var for i in grp.outputs]
    if len(outs) == 1:
        return [relax.VarBinding(outs[0], relax.Call(gv, args))]
    tup = relax.DataflowVar(f"{grp.name}_out", relax.TupleType([v.ty for v in outs]))
    return [relax.VarBinding(tup, relax.Call(gv, args))] + \
        [relax.VarBinding(v, relax.TupleGetItem(tup, k)) for k, v in enumerate(outs)]


def merged_kernels(mod: tvm.IRModule, g: KernelGraph, groups: list[Group]) -> list[tirx.PrimFunc | None]:
    """The PrimFunc each group became. Found through the binding of the group's first output,
    which keeps its Var (FuseTIR shares one PrimFunc among identical groups, so names do not tell)."""
    called = {}
    for b in mod["main"].body.blocks[0].bindings:
        v = b.value
        if isinstance(v, relax.Call) and getattr(v.op, "name", None) == "relax.call_tir":
            called[b.var] = mod[v.args[0]]
        elif isinstance(v, relax.TupleGetItem) and v.tuple_value in called:
            called[b.var] = called[v.tuple_value]
    return [called.get(g.bindings[grp.outputs[0]].var) for grp in groups]
