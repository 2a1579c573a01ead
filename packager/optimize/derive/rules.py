"""EinNet's intra-expression derivation rules (OSDI'23 §4.1) as generators: each yields every
legal rewrite of a scope at one kind of site and yields nothing where the rule's precondition
does not hold (an illegal site is refused, never rewritten "approximately").

- R1 summation splitting: Sum_{s1,s2} f  ->  Sum_{s1} { L_{s1, x} Sum_{s2} f }[s1, x]
- R2 variable substitution (with R4's relaxing to the bounding box): a nested scope's traversal
  v is replaced by t = e (an index of one of its reads, unimodular in v), its readers read it at
  e's value; the scope is computed over e's bounding box, a superset of what is read.
- R3 traversal merging: a read of a nested scope is replaced by the scope's body (its
  summations joining the reader's when the read is a product factor), when every read stays
  inside the nested scope's ranges.
- R5 boundary tightening: a nested scope's traversal range shrinks to where its body can be
  non-zero (a product factor reads a zero-padded tensor out of range elsewhere); the trimmed
  points become the scope's zero padding.

Rewrites apply at the top scope and, recursively, inside every nested scope.
"""
from __future__ import annotations

from itertools import combinations
from typing import Iterator

from .expr import (Access, BinOp, Index, Iter, Node, Scope, Tensor, accesses, map_accesses, mul, read, scope,
                   substitute)

Rewrite = tuple[str, Scope]          # (rule name with its site, the rewritten top scope)


def bounds(index: Index, ranges: dict[str, Iter]) -> tuple[int, int]:
    """Least and greatest value of the index over the iterators' ranges (conservative for / and %)."""
    lo = hi = index.const
    for atom, c in index.terms:
        if isinstance(atom, str):
            a_lo, a_hi = ranges[atom].lo, ranges[atom].hi - 1
        else:
            i_lo, i_hi = bounds(atom.arg, ranges)
            a_lo, a_hi = (i_lo // atom.k, i_hi // atom.k) if atom.op == "/" else (0, atom.k - 1)
        lo, hi = lo + min(c * a_lo, c * a_hi), hi + max(c * a_lo, c * a_hi)
    return lo, hi


def factors(node: Node) -> list[Node]:
    if isinstance(node, BinOp) and node.op == "*":
        return factors(node.a) + factors(node.b)
    return [node]


def _product(parts: list[Node]) -> Node:
    out = parts[0]
    for p in parts[1:]:
        out = mul(out, p)
    return out


def _fresh(base: str, taken: set[str]) -> str:
    k = 0
    while f"{base}{k}" in taken:
        k += 1
    return f"{base}{k}"


def _inside(a: Access, ranges: dict[str, Iter]) -> bool:
    """Every point of the read lies inside its scope source's ranges."""
    for idx, it in zip(a.index, a.source.travs):
        lo, hi = bounds(idx, ranges)
        if lo < it.lo or hi >= it.hi:
            return False
    return True


def _replace_source(s: Scope, old: Scope, new_read) -> Scope:
    """s with every read of `old` replaced by new_read(read)."""
    body = map_accesses(s.body, lambda a: new_read(a) if a.source is old else a)
    return scope(s.travs, s.sums, body, s.pad)


# R1 -----------------------------------------------------------------------------------------

def summation_split(s: Scope) -> Iterator[Rewrite]:
    for k in range(1, len(s.sums)):
        for inner_sums in combinations(s.sums, k):
            outer_sums = [it for it in s.sums if it not in inner_sums]
            inner = scope([*outer_sums, *s.travs], inner_sums, s.body)
            body = read(inner, *(it.name for it in (*outer_sums, *s.travs)))
            yield f"R1 split Sum_{{{','.join(i.name for i in inner_sums)}}}", scope(s.travs, outer_sums, body, s.pad)


# R2 -----------------------------------------------------------------------------------------

def variable_substitution(s: Scope) -> Iterator[Rewrite]:
    ranges = s.iters()
    for inner in {a.source for a in accesses(s.body) if isinstance(a.source, Scope)}:
        if not all(_inside(a, ranges) for a in accesses(s.body) if a.source is inner):
            continue                       # a reader relies on the padding outside the ranges
        trav_names = {it.name for it in inner.travs}
        seen = set()
        for r in accesses(inner.body):
            for e in r.index:
                if not e.affine or not e.iters() <= trav_names or len(e.iters()) < 2 or e in seen:
                    continue
                seen.add(e)
                for pos, it in enumerate(inner.travs):
                    c = e.coeff(it.name)
                    if c in (1, -1):
                        yield f"R2 {it.name} -> {e}", _substitute(s, inner, pos, e, c)


def _substitute(s: Scope, inner: Scope, pos: int, e: Index, c: int) -> Scope:
    v = inner.travs[pos]
    t = _fresh("t", set(inner.iters()) | set(s.iters()))
    lo, hi = bounds(e, inner.iters())
    rest = e - Index.of(v.name) * c
    body = substitute(inner.body, {v.name: (Index.of(t) - rest) * c})
    travs = list(inner.travs)
    travs[pos] = Iter(t, lo, hi + 1)
    new_inner = scope(travs, inner.sums, body, inner.pad)
    return _replace_source(s, inner, lambda r: read(new_inner, *_moved(r, inner, pos, e)))


def _moved(r: Access, inner: Scope, pos: int, e: Index) -> list[Index]:
    """A reader's index into the substituted scope: position pos reads e at the old point."""
    outer_of = {it.name: idx for it, idx in zip(inner.travs, r.index)}
    index = list(r.index)
    index[pos] = e.substitute(outer_of)
    return index


# R3 -----------------------------------------------------------------------------------------

def traversal_merge(s: Scope) -> Iterator[Rewrite]:
    ranges = s.iters()
    parts = factors(s.body)
    for a in {a for a in accesses(s.body) if isinstance(a.source, Scope)}:
        inner = a.source
        if not _inside(a, ranges):
            continue
        if not inner.sums:
            mapping = {it.name: idx for it, idx in zip(inner.travs, a.index)}
            inlined = substitute(inner.body, mapping)
            body = map_accesses(s.body, lambda r: inlined if r == a else r)
            yield f"R3 merge {inner.name}", scope(s.travs, s.sums, body, s.pad)
        elif parts.count(a) == 1 and len(accesses(s.body)) == len(parts) - _consts(parts):
            taken = set(ranges) | set(inner.iters())
            renamed, new_sums = {}, []
            for it in inner.sums:
                name = _fresh(it.name, taken)
                taken.add(name)
                renamed[it.name] = Index.of(name)
                new_sums.append(Iter(name, it.lo, it.hi))
            mapping = {it.name: idx for it, idx in zip(inner.travs, a.index)} | renamed
            inlined = substitute(inner.body, mapping)
            body = _product([inlined if p == a else p for p in parts])
            yield f"R3 merge {inner.name} with its sums", scope(s.travs, [*s.sums, *new_sums], body, s.pad)


def _consts(parts: list[Node]) -> int:
    return sum(1 for p in parts if not isinstance(p, Access))


# R5 -----------------------------------------------------------------------------------------

def boundary_tighten(s: Scope) -> Iterator[Rewrite]:
    for inner in {a.source for a in accesses(s.body) if isinstance(a.source, Scope)}:
        if inner.pad != 0.0:
            continue
        for pos, it in enumerate(inner.travs):
            lo, hi = _nonzero_range(inner, it)
            if (lo, hi) != (it.lo, it.hi) and lo < hi:
                travs = list(inner.travs)
                travs[pos] = Iter(it.name, lo, hi)
                tight = scope(travs, inner.sums, inner.body, 0.0)
                yield (f"R5 tighten {it.name} to [{lo},{hi})",
                       _replace_source(s, inner, lambda r: read(tight, *r.index)))


def _nonzero_range(inner: Scope, it: Iter) -> tuple[int, int]:
    """The sub-range of `it` outside which some product factor reads a zero-padded tensor out of
    bounds for every value of the other iterators (so the body is 0 there)."""
    lo, hi = it.lo, it.hi
    for f in factors(inner.body):
        if not isinstance(f, Access) or f.source.pad != 0.0:
            continue
        shape = f.source.shape if isinstance(f.source, Tensor) else None
        for d, idx in enumerate(f.index):
            if idx.iters() != {it.name} or not idx.affine:
                continue
            c, k = idx.coeff(it.name), idx.const
            d_lo, d_hi = (0, shape[d]) if shape is not None else (f.source.travs[d].lo, f.source.travs[d].hi)
            if c > 0:                      # d_lo <= c*v + k < d_hi
                lo, hi = max(lo, -((k - d_lo) // c)), min(hi, (d_hi - k - 1) // c + 1)
            else:
                c = -c                     # d_lo <= k - c*v < d_hi
                lo, hi = max(lo, (k - d_hi) // c + 1), min(hi, (k - d_lo) // c + 1)
    return lo, hi


# all rules, at every depth ------------------------------------------------------------------

INTRA = (summation_split, variable_substitution, traversal_merge, boundary_tighten)


def rewrites(s: Scope, rules=INTRA) -> Iterator[Rewrite]:
    """Every one-step rewrite of s: at s itself, then inside each nested scope it reads."""
    for rule in rules:
        yield from rule(s)
    for inner in {a.source for a in accesses(s.body) if isinstance(a.source, Scope)}:
        for name, new_inner in rewrites(inner, rules):
            yield name, _replace_source(s, inner, lambda r: read(new_inner, *r.index))
