"""Expression fingerprints (EinNet §6.2): one hash for expressions that differ only by
summation order, operand order of commutative operations, iterator names, or the names of
scopes holding the same value, so the search drops a state it has already seen. Traversal order
is the output layout and stays significant.

The hash is over a canonical text (iterators renamed by position for traversals and by range
for summations, the lexicographically least naming taken among summations of equal range,
commutative operands sorted); the search compares the canonical text itself when two hashes
meet, so a collision cannot merge distinct states.
"""
from __future__ import annotations

import hashlib
from itertools import permutations, product

from .expr import COMMUTATIVE, Access, BinOp, Const, Func, Index, Node, Scope, Tensor

MAX_RENAMINGS = 720          # summation namings tried per scope (6 iterators of one range)


def canonical(s: Scope) -> str:
    travs = {it.name: f"t{i}" for i, it in enumerate(s.travs)}
    head = ",".join(f"[{it.lo},{it.hi})" for it in s.travs)
    groups: dict[tuple[int, int], list[str]] = {}
    for it in s.sums:
        groups.setdefault((it.lo, it.hi), []).append(it.name)
    ranges = sorted(groups)
    best = None
    for k, choice in enumerate(product(*(permutations(groups[r]) for r in ranges))):
        if k >= MAX_RENAMINGS:
            break
        names = dict(travs)
        for r, order in zip(ranges, choice):
            names.update({n: f"s{r[0]}_{r[1]}_{j}" for j, n in enumerate(order)})
        text = _node(s.body, {n: Index.of(v) for n, v in names.items()})
        best = text if best is None or text < best else best
    sums = ";".join(f"{r}x{len(groups[r])}" for r in ranges)
    return f"L{head} S{sums} pad{s.pad} {best}"


def fingerprint(s: Scope) -> int:
    return text_hash(canonical(s))


def text_hash(text: str) -> int:
    """The fingerprint of a canonical text (the search has the text already)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _node(n: Node, names: dict[str, Index]) -> str:
    if isinstance(n, Const):
        return repr(n.value)
    if isinstance(n, BinOp):
        a, b = _node(n.a, names), _node(n.b, names)
        if n.op in COMMUTATIVE and b < a:
            a, b = b, a
        return f"({a}{n.op}{b})"
    if isinstance(n, Func):
        return f"{n.name}({_node(n.arg, names)})"
    return _access(n, names)


def _access(a: Access, names: dict[str, Index]) -> str:
    src = a.source
    head = f"{src.name}{list(src.shape)}p{src.pad}" if isinstance(src, Tensor) else "{" + canonical(src) + "}"
    return head + "[" + ",".join(str(i.substitute(names)) for i in a.index) + "]"
