"""EinNet's converging derivation (OSDI'23 §6.1): a matmul-class scope whose groups hold several
iterators is driven to a plain (batched) matmul, one iterator per group, by distance-reducing
variable substitutions only.

The distance is the number of iterators beyond one per group (batch, m, n, k). Each step merges
two iterators x, y of one group into q = x * Y + y (x = q / Y, y = q % Y: the `q * N + r` affine
bijection, Y = y's extent), which lowers the distance by exactly one. A merge is legal where x
and y run from 0 and, in every operand and in the output, x's dimensions come right before y's:
then the target operator's tensors (A'[q, ..] = A[q / Y, q % Y, ..], EinNet's Eq. 2 and 3) and
its output are reshapes of the old ones, DLTs that cost no copy. Only a scope in GEMM layout
(layout.py: permutation reads of whole tensors in [batch, m, k] x [batch, k, n] order) is
converged, and it always converges; a merge anywhere else is refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .expr import Index, Iter, Scope, scope, substitute
from .match import extra_iterators, gemm_groups, operands
from .rules import _fresh

GROUPS = ("batch", "m", "n", "k")


def distance(s: Scope) -> float:
    """Iterators beyond one per group; inf outside the matmul class (div/mod reads allowed)."""
    g = gemm_groups(s)
    return math.inf if g is None else extra_iterators(g)


@dataclass(frozen=True)
class Step:
    name: str
    scope: Scope
    distance: float


def converge(s: Scope) -> list[Step] | None:
    """The merges from s to distance 0 (each step's scope and distance), or None when a merge
    needed on the way is not a reshape (see module doc)."""
    from .layout import gemm_order

    if gemm_order(s) is None:
        return None
    steps: list[Step] = []
    while distance(s) > 0:
        g = gemm_groups(s)
        group = next(k for k in GROUPS if len(g.get(k, [])) > 1)
        x, y = g[group][:2]
        merged = merge(s, x, y)
        if merged is None:
            return None
        s = merged
        steps.append(Step(f"converge {x},{y} -> {group}", s, distance(s)))
    return steps


def merge(s: Scope, x: str, y: str) -> Scope | None:
    """s with iterators x, y replaced by q = x * Y + y, or None where that is no reshape."""
    ranges = s.iters()
    if ranges[x].lo != 0 or ranges[y].lo != 0 or not _adjacent([it.name for it in s.travs], x, y, optional=True):
        return None
    if not all(_adjacent(_dims(a.index), x, y, optional=True) for a in operands(s) or []):
        return None
    q = _fresh("q", set(ranges))
    extent_y = ranges[y].extent
    body = substitute(s.body, {x: Index.of(q) // extent_y, y: Index.of(q) % extent_y})
    new_iter = Iter(q, 0, ranges[x].extent * extent_y)
    travs = [new_iter if it.name == x else it for it in s.travs if it.name != y]
    sums = [new_iter if it.name == x else it for it in s.sums if it.name != y]
    return scope(travs, sums, body, s.pad)


def _dims(index: tuple[Index, ...]) -> list[str | None]:
    """Per dimension, the one iterator it reads plainly or through a div/mod (None otherwise)."""
    out = []
    for i in index:
        plain = len(i.terms) == 1 and i.terms[0][1] == 1 and i.const == 0 and len(i.iters()) == 1
        out.append(next(iter(i.iters())) if plain else None)
    return out


def _adjacent(dims: list[str | None], x: str, y: str, optional: bool = False) -> bool:
    """x's dimensions form one run immediately followed by y's (both absent is fine where optional)."""
    xs = [p for p, d in enumerate(dims) if d == x]
    ys = [p for p, d in enumerate(dims) if d == y]
    if not xs and not ys:
        return optional
    runs = lambda ps: ps == list(range(ps[0], ps[0] + len(ps))) if ps else False   # noqa: E731
    return runs(xs) and runs(ys) and xs[-1] + 1 == ys[0]


def matmul_shape(s: Scope) -> tuple[int | None, int, int, int] | None:
    """(batch or None, m, k, n) extents of the plain matmul s converges to, or None."""
    steps = converge(s)
    if steps is None:
        return None
    final = steps[-1].scope if steps else s
    g = gemm_groups(final)
    ext = final.iters()
    size = lambda k: ext[g[k][0]].extent if g.get(k) else None             # noqa: E731
    return size("batch"), size("m"), size("k"), size("n")
