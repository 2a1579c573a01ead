"""The derivation rules behind EinNet's dilated -> non-dilated rewrite (§3: G2BMM reordered by
parity; the same for a dilated conv), kept apart from rules.py's set because they only pay where
a read steps by k >= 2:

- traversal split (R2 with a bijection that is not unimodular): a traversal v becomes (v_o, v_i)
  with v = k*v_o + v_i, v_i in [0, k); readers read (v // k, v % k). At the top scope the split
  scope is wrapped, so the output keeps its layout.
- read relayout (EinNet's DLT): a read X[..., k*P + R, ...] becomes X'[..., R, P, ...] with
  X' = L_{rho, pi} X[..., k*pi + rho, ...] over R's and P's ranges: exact, since every point read
  is inside those ranges, and X' reads X's padding wherever X would.

After splitting a dilation-k conv's output rows and columns by k, its input read is
X[n, c, k*(h_o + r) + h_i - p, ...]; relayout makes it X'[n, c, h_i - p, h_o + r, ...]: a
non-dilated conv batched over the k x k phases.
"""
from __future__ import annotations

from typing import Iterator

from .expr import Index, Iter, Scope, Tensor, accesses, map_accesses, read, scope, substitute
from .rules import INTRA, Rewrite, bounds


def _fresh(base: str, taken: set[str]) -> str:
    name = base
    while name in taken:
        name += "_"
    return name


def _strides_with(s: Scope, v: str) -> set[int]:
    """k >= 2 that step another iterator in an index where v steps by 1."""
    out = set()
    for a in accesses(s.body):
        for idx in a.index:
            if idx.affine and idx.coeff(v) == 1:
                out |= {abs(c) for n, c in idx.terms if n != v and abs(c) >= 2}
    return out


def traversal_split(s: Scope) -> Iterator[Rewrite]:
    taken = set(s.iters())
    for pos, it in enumerate(s.travs):
        for k in sorted(_strides_with(s, it.name)):
            outer, inner = _fresh(f"{it.name}o", taken), _fresh(f"{it.name}i", taken)
            travs = list(s.travs)
            travs[pos:pos + 1] = [Iter(outer, it.lo // k, -(-it.hi // k)), Iter(inner, 0, k)]
            body = substitute(s.body, {it.name: Index.of(outer) * k + Index.of(inner)})
            split = scope(travs, s.sums, body, s.pad)
            index = [Index.of(t.name) for t in s.travs]
            index[pos:pos + 1] = [Index.of(it.name) // k, Index.of(it.name) % k]
            yield f"R2 split {it.name} = {k}*{outer} + {inner}", scope(s.travs, [], read(split, *index), s.pad)


def read_relayout(s: Scope) -> Iterator[Rewrite]:
    ranges = s.iters()
    for a in {a for a in accesses(s.body) if isinstance(a.source, Tensor)}:
        ks = {abs(c) for idx in a.index if idx.affine for _, c in idx.terms if abs(c) >= 2}
        for k in sorted(ks):
            relaid = _relayout(a, k, ranges)
            if relaid is not None:
                yield f"DLT {a.source.name} by {k}", scope(s.travs, s.sums,
                                                           map_accesses(s.body, lambda r: relaid if r == a else r), s.pad)


def _relayout(a, k: int, ranges: dict[str, Iter]):
    """a read as X'[..., R, P, ...] for every dimension k*P + R with both parts present."""
    its, src_index, new_index, changed = [], [], [], False
    for d, idx in enumerate(a.index):
        p_terms = {n: c // k for n, c in idx.terms if c % k == 0}
        r_terms = {n: c for n, c in idx.terms if c % k}
        name = f"x{d}"
        if idx.affine and p_terms and (r_terms or idx.const):
            P, R = Index.build(p_terms, 0), Index.build(r_terms, idx.const)
            (r_lo, r_hi), (p_lo, p_hi) = bounds(R, ranges), bounds(P, ranges)
            its += [Iter(f"{name}r", r_lo, r_hi + 1), Iter(f"{name}p", p_lo, p_hi + 1)]
            src_index.append(Index.of(f"{name}p") * k + Index.of(f"{name}r"))
            new_index += [R, P]
            changed = True
        else:
            its.append(Iter(name, 0, a.source.shape[d]))
            src_index.append(Index.of(name))
            new_index.append(idx)
    if not changed:
        return None
    view = scope(its, [], read(a.source, *src_index))
    return read(view, *new_index)


DILATION = (*INTRA, traversal_split, read_relayout)
