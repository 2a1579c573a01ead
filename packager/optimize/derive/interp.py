"""A numpy interpreter for derive's expressions: the oracle every rule is tested against.

Each scope is evaluated over the broadcast grid of its traversals and summations (one numpy
axis per iterator), reads gather with a mask so out-of-range indices read the padding, and the
summation axes are summed last. Nested scopes are evaluated once each and read like tensors.
"""
from __future__ import annotations

import numpy as np

from .expr import Access, BinOp, Const, DivMod, Func, Index, Node, Scope, Tensor

FUNCS = {"relu": lambda x: np.maximum(x, 0), "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x))}
OPS = {"+": np.add, "-": np.subtract, "*": np.multiply, "max": np.maximum}


def evaluate(expr: Scope, inputs: dict[str, np.ndarray], dtype=np.float64) -> np.ndarray:
    """The scope's output (shape = its traversal extents) on the named input arrays."""
    return _Interpreter(inputs, dtype).scope(expr)


class _Interpreter:
    def __init__(self, inputs: dict[str, np.ndarray], dtype):
        self.inputs = {k: np.asarray(v, dtype) for k, v in inputs.items()}
        self.dtype = dtype
        self.done: dict[Scope, np.ndarray] = {}

    def scope(self, s: Scope) -> np.ndarray:
        if s not in self.done:
            its = (*s.travs, *s.sums)
            env = {}
            for axis, it in enumerate(its):
                shape = [1] * len(its)
                shape[axis] = it.extent
                env[it.name] = np.arange(it.lo, it.hi).reshape(shape)
            grid = tuple(it.extent for it in its)
            value = np.broadcast_to(self.node(s.body, env), grid).astype(self.dtype)
            self.done[s] = value.sum(axis=tuple(range(len(s.travs), len(its)))) if s.sums else value.copy()
        return self.done[s]

    def node(self, n: Node, env: dict) -> np.ndarray:
        if isinstance(n, Const):
            return np.asarray(n.value, self.dtype)
        if isinstance(n, BinOp):
            return OPS[n.op](self.node(n.a, env), self.node(n.b, env))
        if isinstance(n, Func):
            return FUNCS[n.name](self.node(n.arg, env))
        return self.read(n, env)

    def read(self, a: Access, env: dict) -> np.ndarray:
        if isinstance(a.source, Tensor):
            data, lows, pad = self.inputs[a.source.name], [0] * len(a.index), a.source.pad
            if data.shape != a.source.shape:
                raise ValueError(f"input {a.source.name}: shape {data.shape}, expression wants {a.source.shape}")
        else:
            data, lows, pad = self.scope(a.source), [it.lo for it in a.source.travs], a.source.pad
        idx = [index_value(i, env) - lo for i, lo in zip(a.index, lows)]
        idx = np.broadcast_arrays(*idx) if idx else []
        inside = np.ones(idx[0].shape if idx else (), bool)
        for i, n in zip(idx, data.shape):
            inside &= (i >= 0) & (i < n)
        clipped = tuple(np.clip(i, 0, n - 1) for i, n in zip(idx, data.shape))
        return np.where(inside, data[clipped], np.asarray(pad, self.dtype))


def index_value(index: Index, env: dict):
    """The index's integer value on the iterators' grids (floor division / modulo)."""
    total = np.asarray(index.const)
    for atom, c in index.terms:
        if isinstance(atom, DivMod):
            inner = index_value(atom.arg, env)
            v = np.floor_divide(inner, atom.k) if atom.op == "/" else np.mod(inner, atom.k)
        else:
            v = env[atom]
        total = total + c * v
    return total
