"""EinNet's data layout transforms (DLT) for a derived matmul: its operands and its output are put
in the order a GEMM wants ([batch, m, k] x [batch, k, n] -> [batch, m, n]), so the scope lowers
to one matmul the packager compiles well (layout panels, Gensor).

A constant operand (a weight) is re-laid at build time (EinNet's compile-time expression
evaluation); a run-time operand read out of order gets a transpose eOperator in front; the
matmul's readers read its reordered output. Only permutation reads are handled (every operand
dimension is one iterator over its whole extent); other matmul scopes stay as they are.
"""
from __future__ import annotations

from dataclasses import dataclass

from .expr import Access, Iter, Scope, Tensor, map_accesses, mul, read, scope
from .match import gemm_groups, operands


@dataclass
class Relaid:
    """A weight in a new layout: new = numpy.transpose(old, perm)."""

    old: str
    perm: tuple[int, ...]


def gemm_order(s: Scope) -> tuple[list[str], list[str], list[str], list[str]] | None:
    """(batch, m, n, k) iterator names of a matmul scope whose operands are permutation reads of
    whole tensors (traversals from 0), in the order they appear in the scope; None otherwise."""
    g = gemm_groups(s)
    if g is None:
        return None
    ranges = s.iters()
    if any(it.lo != 0 for it in (*s.travs, *s.sums)):
        return None
    for a in operands(s):
        names = [i.terms[0][0] if len(i.terms) == 1 and i.terms[0][1] == 1 and not i.const and i.affine else None
                 for i in a.index]
        if None in names or len(set(names)) != len(names):
            return None
        if any(ranges[n].extent != d for n, d in zip(names, a.source.shape)):
            return None
    order = [it.name for it in (*s.travs, *s.sums)]
    return tuple([n for n in order if n in g.get(k, [])] for k in ("batch", "m", "n", "k"))


def to_gemm_layout(program: Scope, constants: set[str]) -> tuple[Scope, dict[str, Relaid]]:
    """The program with every permutation-read matmul scope in GEMM order (see module doc)."""
    relaid: dict[str, Relaid] = {}
    permuted: dict[Scope, list[int]] = {}       # reordered matmul -> old traversal position per new one
    done: dict[Scope, Scope] = {}

    def visit(s: Scope) -> Scope:
        if s in done:
            return done[s]
        body = map_accesses(s.body, lambda a: read(visit(a.source), *a.index) if isinstance(a.source, Scope) else a)
        new = scope(s.travs, s.sums, body, s.pad)
        new = _gemm(new, constants, relaid, permuted) or new
        done[s] = new
        return new

    return _reads_fixed(visit(program), permuted), relaid


def _gemm(s: Scope, constants: set[str], relaid: dict[str, Relaid], permuted: dict) -> Scope | None:
    order = gemm_order(s)
    if order is None:
        return None
    batch, m, n, k = order
    ranges = s.iters()
    a, b = operands(s)
    if a.source.name in constants and b.source.name not in constants:
        a, b = b, a                                   # the run-time operand on the left
    if not set(m) <= set(a.index[i].terms[0][0] for i in range(len(a.index))):
        m, n = n, m                                   # the left operand holds m
    new_a = _operand(a, [*batch, *m, *k], ranges, constants, relaid)
    new_b = _operand(b, [*batch, *k, *n], ranges, constants, relaid)
    travs = [ranges[x] for x in (*batch, *m, *n)]
    out = scope(travs, [ranges[x] for x in k], mul(new_a, new_b), s.pad)
    perm = [[it.name for it in s.travs].index(x) for x in (*batch, *m, *n)]
    if perm != sorted(perm):
        permuted[out] = perm
    return out


def _operand(a: Access, want: list[str], ranges: dict[str, Iter], constants: set[str],
             relaid: dict[str, Relaid]) -> Access:
    names = [i.terms[0][0] for i in a.index]
    if names == want:
        return a
    perm = tuple(names.index(x) for x in want)
    shape = tuple(a.source.shape[p] for p in perm)
    if isinstance(a.source, Tensor) and a.source.name in constants:
        name = f"{a.source.name}_t{''.join(map(str, perm))}"
        relaid[name] = Relaid(a.source.name, perm)
        return read(Tensor(name, shape, a.source.pad), *want)
    dlt = scope([Iter(f"d{i}", 0, d) for i, d in enumerate(shape)], [],
                read(a.source, *[f"d{want.index(x)}" for x in names]))
    return read(dlt, *want)


def _reads_fixed(top: Scope, permuted: dict[Scope, list[int]]) -> Scope:
    """Readers of a reordered matmul read its new layout (positions permuted)."""
    done: dict[Scope, Scope] = {}

    def visit(s: Scope) -> Scope:
        if s in done:
            return done[s]

        def fix(a: Access):
            if not isinstance(a.source, Scope):
                return a
            src = visit(a.source)
            perm = permuted.get(a.source)
            return read(src, *([a.index[p] for p in perm] if perm else a.index))
        new = scope(s.travs, s.sums, map_accesses(s.body, fix), s.pad)
        done[s] = new
        return new
    return visit(top)

