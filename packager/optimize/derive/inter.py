"""EinNet's inter-expression rules (OSDI'23 §4.2) over a program of independent expressions (a
tuple of scopes, one per output):

- R6 expression splitting: L_{x in X} f  ->  L_{x in X1} f ~ L_{x in X2} f, the traversal range
  of one iterator cut in two; the outputs are the two pieces (their readers concatenate them).
- R7 expression merging: two expressions with the same computation that read one tensor the same
  way and differ only in a second tensor along one traversal become one expression over the
  concatenated range; that tensor is the concatenation, written as an expression too (padding
  makes it a sum of two shifted reads), and each output is a slice of the merged one. Sibling
  matmuls on a shared input become one matmul on concatenated weights.
- R8 expression fusion: an expression that reads another's output (a tensor named after that
  output) reads the producer's scope instead, so the two become one expression (OffsetReduce +
  Relu in one eOperator). Only exact: the producer covers the whole tensor (traversals from 0 over
  its shape) and pads as the tensor does; the producer stays an output while others read it.

A program here is `Outputs`: name -> scope. Each rule yields (its name, the new outputs, where
every old output's values now are), so a caller can check and rewire them.
"""
from __future__ import annotations

from typing import Iterator

from .expr import Access, Index, Iter, Scope, Tensor, accesses, add, map_accesses, read, scope

Outputs = dict[str, Scope]


def _with_range(s: Scope, pos: int, lo: int, hi: int) -> Scope:
    travs = list(s.travs)
    travs[pos] = Iter(travs[pos].name, lo, hi)
    return scope(travs, s.sums, s.body, s.pad)


def split(outputs: Outputs) -> Iterator[tuple[str, Outputs, dict]]:
    """R6: every output cut in halves along each traversal of extent >= 2. The pieces keep the
    iterator values (the second piece starts at the cut), so piece values are the original's."""
    for name, s in outputs.items():
        for pos, it in enumerate(s.travs):
            if it.extent < 2:
                continue
            cut = it.lo + it.extent // 2
            rest = {k: v for k, v in outputs.items() if k != name}
            pieces = {f"{name}.0": _with_range(s, pos, it.lo, cut), f"{name}.1": _with_range(s, pos, cut, it.hi)}
            yield f"R6 split {name} at {it.name} = {cut}", rest | pieces, {name: (pos, list(pieces))}


def merge(outputs: Outputs) -> Iterator[tuple[str, Outputs, dict]]:
    """R7: pairs of outputs that differ only in one tensor, concatenated along one traversal."""
    names = list(outputs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            found = _mergeable(outputs[a], outputs[b])
            if found is None:
                continue
            pos, ta, tb, dim = found
            merged, slices = _merged(outputs[a], outputs[b], pos, ta, tb, dim)
            rest = {k: v for k, v in outputs.items() if k not in (a, b)}
            yield f"R7 merge {a} + {b} along {outputs[a].travs[pos].name}", rest | {f"{a}+{b}": merged}, {
                a: (f"{a}+{b}", pos, slices[0]), b: (f"{a}+{b}", pos, slices[1])}


def fuse(outputs: Outputs) -> Iterator[tuple[str, Outputs, dict]]:
    """R8: every (producer, consumer) pair where the consumer reads the producer's output."""
    for c_name, c in outputs.items():
        for t in sorted({a.source for a in accesses(c.body) if _produced(a.source, outputs, c_name)},
                        key=lambda t: t.name):
            p = outputs[t.name]
            if not _covers(p, t):
                continue
            body = map_accesses(c.body, lambda a: read(p, *a.index) if a.source == t else a)
            fused = {c_name: scope(c.travs, c.sums, body, c.pad)}
            still_read = any(_reads(e, t) for k, e in outputs.items() if k not in (c_name, t.name))
            rest = {k: v for k, v in outputs.items() if k != c_name and (k != t.name or still_read)}
            yield f"R8 fuse {t.name} into {c_name}", rest | fused, {c_name: c_name}


def _produced(source, outputs: Outputs, consumer: str) -> bool:
    return isinstance(source, Tensor) and source.name in outputs and source.name != consumer


def _covers(p: Scope, t: Tensor) -> bool:
    """The producer's values are exactly the tensor's, padding included."""
    return p.shape == t.shape and all(it.lo == 0 for it in p.travs) and p.pad == t.pad


def _reads(e: Scope, t: Tensor) -> bool:
    return any(a.source == t for a in accesses(e.body))


def _mergeable(x: Scope, y: Scope):
    """(traversal position, the differing tensors, their dimension indexed by that traversal
    alone), or None. Same iterators, summations and body shape; exactly one read differs."""
    if x.sums != y.sums or x.pad != y.pad or len(x.travs) != len(y.travs):
        return None
    if [it.name for it in x.travs] != [it.name for it in y.travs]:
        return None
    rx, ry = accesses(x.body), accesses(y.body)
    if len(rx) != len(ry) or any(type(a.source) is not Tensor or type(b.source) is not Tensor for a, b in zip(rx, ry)):
        return None
    diff = [(a, b) for a, b in zip(rx, ry) if a != b]
    if len(diff) != 1:
        return None
    a, b = diff[0]
    if a.index != b.index or a.source.name == b.source.name or a.source.pad != 0.0 or b.source.pad != 0.0:
        return None
    if map_accesses(x.body, lambda r: b if r == a else r) != y.body:
        return None                                     # the computations differ elsewhere
    varying = [p for p, (u, v) in enumerate(zip(x.travs, y.travs)) if u != v]
    for pos, it in enumerate(x.travs):
        if varying and varying != [pos]:
            continue
        dims = [d for d, idx in enumerate(a.index) if idx == Index.of(it.name)]
        others = [r for r in rx if r != a]
        if len(dims) == 1 and it.lo == 0 and y.travs[pos].lo == 0 and not any(it.name in r.index[k].iters()
                                                                                for r in others for k in range(len(r.index))):
            if all(a.source.shape[d] == b.source.shape[d] or d == dims[0] for d in range(len(a.index))):
                return pos, a, b, dims[0]
    return None


def _merged(x: Scope, y: Scope, pos: int, a: Access, b: Access, dim: int):
    """The merged expression over the concatenated tensor, and each output's slice [lo, hi)."""
    n1, n2 = x.travs[pos].extent, y.travs[pos].extent
    shape = list(a.source.shape)
    shape[dim] = n1 + n2
    its = [Iter(f"c{d}", 0, n) for d, n in enumerate(shape)]
    shifted = [Index.of(it.name) - (n1 if d == dim else 0) for d, it in enumerate(its)]
    concat = scope(its, [], add(read(a.source, *[it.name for it in its]), read(b.source, *shifted)))
    cat = read(concat, *a.index)
    travs = list(x.travs)
    travs[pos] = Iter(travs[pos].name, 0, n1 + n2)
    merged = scope(travs, x.sums, map_accesses(x.body, lambda r: cat if r == a else r), x.pad)
    return merged, ((0, n1), (n1, n1 + n2))
