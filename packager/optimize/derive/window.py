"""Summation windows: a summation whose product reads a zero-padded source at `a + c*y` is
non-zero for at most ceil(k / |c|) values of y per output point (k: the source's extent there).

A ConvTranspose's derivation ends in selective reduces such as `Sum_{i in [0,40)} T[h - 2*i]`
over a kernel extent of 2: one term of 40 can be non-zero. Such a summation runs over its
window, y = floor((a - lo) / s) - r (or its negation for c > 0), r in [0, taps), which the cost
estimate counts (match.flops) and the kernels loop over (codegen.py); the interpreter keeps the
full sum, so tests compare the two.
"""
from __future__ import annotations

from dataclasses import dataclass

from .expr import Access, Index, Iter, Scope, Tensor
from .rules import factors


@dataclass(frozen=True)
class Window:
    """Summation `it` read at `offset + coeff * it` in a dimension holding [lo, lo + extent)."""

    it: Iter
    offset: Index
    coeff: int
    lo: int
    extent: int

    @property
    def taps(self) -> int:
        return -(-self.extent // abs(self.coeff))


def windows(s: Scope) -> dict[str, Window]:
    """The narrowest window of every summation that has one smaller than its range."""
    sums = {it.name: it for it in s.sums}
    out: dict[str, Window] = {}
    for f in factors(s.body):
        if not isinstance(f, Access) or f.source.pad != 0:
            continue
        lows = [0] * len(f.index) if isinstance(f.source, Tensor) else [it.lo for it in f.source.travs]
        for index, lo, extent in zip(f.index, lows, f.source.shape):
            w = _window(index, lo, extent, sums)
            if w is not None and w.taps < w.it.extent and _plain_everywhere(s, w.it.name) and \
                    (w.it.name not in out or w.taps < out[w.it.name].taps):
                out[w.it.name] = w
    return out


def _window(index: Index, lo: int, extent: int, sums: dict[str, Iter]) -> Window | None:
    """The window of the one summation in an index whose other terms are traversals only."""
    mine = [(a, c) for a, c in index.terms if isinstance(a, str) and a in sums]
    if len(mine) != 1:
        return None
    name, coeff = mine[0]
    offset = index - Index.of(name) * coeff
    if offset.iters() & set(sums):
        return None
    return Window(sums[name], offset, coeff, lo, extent)


def _plain_everywhere(s: Scope, name: str) -> bool:
    """The summation appears in no floor division or modulo (its substitution stays affine)."""
    def plain(index: Index) -> bool:
        return all(isinstance(a, str) or name not in a.arg.iters() for a, _ in index.terms)
    return all(plain(i) for f in factors(s.body) if isinstance(f, Access) for i in f.index)
