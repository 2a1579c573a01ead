"""Derived programs as TVM kernels: every scope becomes one TE compute (its traversals the
output axes, its summations reduce axes, padding as a guarded read), and each scope is its own
PrimFunc so the scheduler treats a matmul-class scope as a matmul and an eOperator as the
injective / reduction kernel it is (EinNet §5.2: eOperators are generated, here by TE).
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import te, tirx

from .expr import Access, BinOp, Const, DivMod, Func, Index, Iter, Node, Scope, Tensor, accesses
from .rules import bounds
from .window import Window, windows

TE_FUNCS = {"relu": lambda x: tvm.tirx.max(x, tvm.tirx.const(0, x.dtype)), "tanh": te.tanh, "sigmoid": te.sigmoid}


@dataclass
class Kernel:
    """One scope as a PrimFunc: its parameters are `inputs` (tensor or scope names) then `output`."""

    scope: Scope
    func: tirx.PrimFunc
    inputs: list[str]
    output: str


def scopes_in_order(top: Scope) -> list[Scope]:
    """Every scope of a program, producers before their readers, the top scope last."""
    out: list[Scope] = []

    def visit(s: Scope) -> None:
        for a in accesses(s.body):
            if isinstance(a.source, Scope) and a.source not in out:
                visit(a.source)
        if s not in out:
            out.append(s)
    visit(top)
    return out


def tensors_of(s: Scope) -> list:
    """The tensors and scopes a scope reads, in first-read order."""
    out: list = []
    for a in accesses(s.body):
        if a.source not in out:
            out.append(a.source)
    return out


def kernels(top: Scope, dtype: str = "float32") -> list[Kernel]:
    """One PrimFunc per scope, producers first; intermediate scopes are named t0, t1, ... in
    that order and the top scope `out`."""
    order = scopes_in_order(top)
    names = {s: f"t{i}" for i, s in enumerate(order[:-1])} | {top: "out"}
    out = []
    for s in order:
        sources = tensors_of(s)
        holders = {src: te.placeholder(src.shape, dtype, name=names.get(src, src.name)) for src in sources}
        result = compute(s, holders, dtype, names[s])
        func = te.create_prim_func([*holders.values(), result])
        out.append(Kernel(s, func, [names.get(src, src.name) for src in sources], names[s]))
    return out


def compute(s: Scope, holders: dict, dtype: str, name: str = "out") -> te.Tensor:
    """The scope as a te.compute over placeholders for what it reads."""
    ranges, wins = s.iters(), windows(s)

    def body(*idx):
        env = {it.name: i + it.lo if it.lo else i for it, i in zip(s.travs, idx)}
        axes = [te.reduce_axis((0, wins[it.name].taps) if it.name in wins else (it.lo, it.hi), name=it.name)
                for it in s.sums]
        env.update({it.name: ax.var for it, ax in zip(s.sums, axes) if it.name not in wins})
        inside = [_enter_window(wins[it.name], ax.var, env) for it, ax in zip(s.sums, axes) if it.name in wins]
        value = _node(s.body, env, holders, ranges, dtype)
        if inside:
            value = tvm.tirx.if_then_else(tvm.tirx.all(*[c for conds in inside for c in conds]), value,
                                          tvm.tirx.const(0, dtype))
        return te.sum(value, axis=axes) if axes else value
    return te.compute(s.shape, body, name=name)


def _enter_window(w: Window, tap, env: dict) -> list:
    """Bind the summation to the window's tap-th value (env updated); returns the conditions under
    which that value is in the summation's range and its read inside the source (else the term
    is zero: the body reads nothing then, as if_then_else evaluates one branch)."""
    stride = abs(w.coeff)
    rel = _index(w.offset, env) - w.lo
    first = tvm.tirx.floordiv(rel, stride)
    y = first - tap if w.coeff < 0 else tap - first
    env[w.it.name] = y
    return [y >= w.it.lo, y < w.it.hi, tvm.tirx.floormod(rel, stride) + tap * stride < w.extent]


def _node(n: Node, env: dict, holders: dict, ranges: dict[str, Iter], dtype: str):
    if isinstance(n, Const):
        return tvm.tirx.const(n.value, dtype)
    if isinstance(n, BinOp):
        a, b = _node(n.a, env, holders, ranges, dtype), _node(n.b, env, holders, ranges, dtype)
        return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "max": lambda: tvm.tirx.max(a, b)}[n.op]()
    if isinstance(n, Func):
        return TE_FUNCS[n.name](_node(n.arg, env, holders, ranges, dtype))
    return _read(n, env, holders, ranges, dtype)


def _read(a: Access, env: dict, holders: dict, ranges: dict[str, Iter], dtype: str):
    """holder[index - lo], guarded where the index can leave the source's range."""
    src = a.source
    lows = [0] * len(a.index) if isinstance(src, Tensor) else [it.lo for it in src.travs]
    conds, idx = [], []
    for index, lo, n in zip(a.index, lows, src.shape):
        value = _index(index, env) - lo if lo else _index(index, env)
        b_lo, b_hi = bounds(index, ranges)
        if b_lo < lo:
            conds.append(value >= 0)
        if b_hi >= lo + n:
            conds.append(value < n)
        idx.append(value)
    load = holders[src](*idx)
    if not conds:
        return load
    return tvm.tirx.if_then_else(tvm.tirx.all(*conds), load, tvm.tirx.const(src.pad, dtype))


def _index(index: Index, env: dict):
    total = tvm.tirx.const(index.const, "int32")
    for atom, c in index.terms:
        if isinstance(atom, DivMod):
            inner = _index(atom.arg, env)
            v = tvm.tirx.floordiv(inner, atom.k) if atom.op == "/" else tvm.tirx.floormod(inner, atom.k)
        else:
            v = env[atom]
        total = total + (v * c if c != 1 else v)
    return total
