"""Instantiation (EinNet §5): which scopes are operators this packager compiles well and which are
memory-bound eOperators, by the iterator mapping table (Table 2) and arithmetic intensity.

An iterator's signature is whether it appears in the first input, the second input and the
output. A two-input product scope is in the (batched) matmul class when every iterator's
signature is one of batch (Y/Y/Y), m (Y/N/Y), n (N/Y/Y) or k (Y/Y/N), m, n, k are all present,
and no operand dimension mixes groups (a conv's `h + r` has the same signatures as a matmul but
no single stride per group: EinNet's StrideMismatch).
Such a scope is instantiated as it is; its distance (iterators beyond one per group) is what
the search orders children by, and what the converging stage (converge.py) merges away before
emission. A scope that adds iterators of different groups in one dimension with unit steps (a
plain conv's h + r) is of the conv class. A scope whose flops per element moved is under 4 is
an eOperator (OffsetReduce, layout transforms): generated as a TE compute, never matched; so is
a scope whose body is one read (a sum of one tensor's elements: at most one add per read, even
where its summation also runs over padding).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .expr import Access, Const, Scope, accesses
from .rules import factors
from .window import windows

EOP_INTENSITY = 4.0          # EinNet's threshold: below it a scope is memory-bound
MATMUL_GROUPS = {(1, 1, 1): "batch", (1, 0, 1): "m", (0, 1, 1): "n", (1, 1, 0): "k"}


def operands(s: Scope) -> list[Access] | None:
    """The two reads of a product body (constants aside), None for any other body."""
    parts = [p for p in factors(s.body) if not isinstance(p, Const)]
    return parts if len(parts) == 2 and all(isinstance(p, Access) for p in parts) else None


def groups(s: Scope) -> dict[str, list[str]] | None:
    """Iterators by matmul group ('other' for a signature no group has), None without two operands."""
    ops = operands(s)
    if ops is None:
        return None
    a_it, b_it = (set().union(*(i.iters() for i in op.index)) for op in ops)
    out_it = {it.name for it in s.travs}
    out: dict[str, list[str]] = {}
    for it in (*s.travs, *s.sums):
        sig = (int(it.name in a_it), int(it.name in b_it), int(it.name in out_it))
        out.setdefault(MATMUL_GROUPS.get(sig, "other"), []).append(it.name)
    return out


def gemm_groups(s: Scope) -> dict[str, list[str]] | None:
    """The groups of a two-operand scope whose iterators are all batch / m / n / k with m, n and
    k present (the matmul and conv classes), else None."""
    g = groups(s)
    if g is None or g.get("other") or not all(g.get(k) for k in ("m", "n", "k")):
        return None
    return g


def matmul_distance(s: Scope) -> float:
    """Iterators beyond one per group (0: a plain matmul); inf outside the matmul class."""
    g = gemm_groups(s)
    if g is None or not all(i.affine for a in operands(s) for i in a.index):
        return math.inf
    group_of = {it: name for name, its in g.items() for it in its}
    for a in operands(s):                 # a dimension mixing groups (conv's h + r) is no GEMM stride
        if any(len({group_of[i] for i in idx.iters()}) > 1 for idx in a.index):
            return math.inf
    return extra_iterators(g)


def extra_iterators(g: dict[str, list[str]]) -> int:
    """Iterators beyond one per group (batch, m, n, k) of gemm_groups' result."""
    return sum(max(len(g.get(k, [])) - 1, 0) for k in ("batch", "m", "n", "k"))


def conv_like(s: Scope) -> bool:
    """A unit-stride, non-dilated conv: the matmul groups, but an operand dimension may add
    iterators of different groups (h + r), each with coefficient 1."""
    if gemm_groups(s) is None:
        return False
    return all(i.affine and all(c == 1 for _, c in i.terms) for a in operands(s) for i in a.index)


def flops(s: Scope) -> float:
    """A product of f factors costs f - 1 multiplies per point, plus one add per point if summed;
    a summation with a window (window.py) counts its taps, not its range."""
    wins = windows(s)
    points = math.prod(it.extent for it in s.travs) * \
        math.prod(wins[it.name].taps if it.name in wins else it.extent for it in s.sums)
    return points * (len(factors(s.body)) - 1 + (1 if s.sums else 0))


def intensity(s: Scope) -> float:
    """Flops per element read or written (each distinct tensor counted once at its full size)."""
    sizes = {a.source: math.prod(a.source.shape) for a in accesses(s.body)}
    return flops(s) / (sum(sizes.values()) + math.prod(s.shape))


@dataclass(frozen=True)
class Piece:
    """One scope of a derived program and how it would be instantiated."""

    scope: Scope
    kind: str                 # matmul | conv | eop | none
    distance: float


def instantiate(s: Scope) -> list[Piece]:
    """Every scope of the program (nested ones first) with its instantiation."""
    out: list[Piece] = []
    for inner in {a.source for a in accesses(s.body) if isinstance(a.source, Scope)}:
        out += instantiate(inner)
    d = matmul_distance(s)
    if intensity(s) < EOP_INTENSITY or isinstance(s.body, Access):
        kind = "eop"                      # memory-bound, or a plain (offset) reduction of one tensor
    elif d < math.inf:
        kind = "matmul"
    elif conv_like(s):
        kind = "conv"
    else:
        kind = "none"
    return out + [Piece(s, kind, d)]
