"""EinNet's tensor-algebra expressions (OSDI'23 §3), the IR the `derive` pass rewrites.

A scope `L_{x in X} Sum_{y in Y} f(T[tau(x, y)])` has ordered traversals (their order is the
output layout), summations (order not semantic), and a body over tensor reads whose indices are
canonical integer forms: a sorted sum of coefficient x atom plus a constant, where an atom is an
iterator or a floor division / modulo of another index. A read outside a tensor's shape (or a
scope's ranges) reads its padding value, 0 unless set: that is how convolution padding is
written, and what boundary tightening moves computation into.

Nodes are immutable and interned (hash-consed): building the same expression twice gives the
same object, so a search's visited set and memo tables compare in O(1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

_TABLE: dict = {}


def _intern(node):
    return _TABLE.setdefault(node, node)


@dataclass(frozen=True)
class DivMod:
    """floor(arg / k) (op "/") or arg mod k (op "%"), k > 0: iterator merges and splits."""

    op: str
    arg: "Index"
    k: int

    def __str__(self) -> str:
        return f"({self.arg}){self.op}{self.k}"


Atom = Union[str, DivMod]


def _atom_key(a: Atom) -> str:
    return a if isinstance(a, str) else "~" + str(a)


@dataclass(frozen=True)
class Index:
    """sum(coeff * atom) + const, terms sorted by atom with no zero coefficient."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(value: "IndexLike") -> "Index":
        if isinstance(value, Index):
            return value
        if isinstance(value, int):
            return _intern(Index((), value))
        if isinstance(value, (str, DivMod)):
            return _intern(Index(((value, 1),), 0))
        raise TypeError(f"not an index: {value!r}")

    @staticmethod
    def build(terms: dict, const: int) -> "Index":
        kept = tuple(sorted(((a, c) for a, c in terms.items() if c != 0), key=lambda t: _atom_key(t[0])))
        return _intern(Index(kept, const))

    def __add__(self, other: "IndexLike") -> "Index":
        o = Index.of(other)
        terms = dict(self.terms)
        for a, c in o.terms:
            terms[a] = terms.get(a, 0) + c
        return Index.build(terms, self.const + o.const)

    __radd__ = __add__

    def __neg__(self) -> "Index":
        return self * -1

    def __sub__(self, other: "IndexLike") -> "Index":
        return self + (-Index.of(other))

    def __rsub__(self, other: "IndexLike") -> "Index":
        return Index.of(other) - self

    def __mul__(self, k: int) -> "Index":
        return Index.build({a: c * k for a, c in self.terms}, self.const * k)

    __rmul__ = __mul__

    def __floordiv__(self, k: int) -> "Index":
        if not self.terms:
            return Index.of(self.const // k)
        return Index.of(_intern(DivMod("/", self, k))) if k != 1 else self

    def __mod__(self, k: int) -> "Index":
        if not self.terms:
            return Index.of(self.const % k)
        return Index.of(_intern(DivMod("%", self, k))) if k != 1 else Index.of(0)

    @property
    def affine(self) -> bool:
        return all(isinstance(a, str) for a, _ in self.terms)

    def coeff(self, name: str) -> int:
        return dict(self.terms).get(name, 0)

    def iters(self) -> set[str]:
        out: set[str] = set()
        for a, _ in self.terms:
            out |= {a} if isinstance(a, str) else a.arg.iters()
        return out

    def substitute(self, mapping: dict[str, "Index"]) -> "Index":
        """The index with each iterator in `mapping` replaced by its index."""
        out = Index.of(self.const)
        for a, c in self.terms:
            if isinstance(a, str):
                out = out + Index.of(mapping.get(a, a)) * c
            else:
                inner = a.arg.substitute(mapping)
                out = out + (inner // a.k if a.op == "/" else inner % a.k) * c
        return out

    def __str__(self) -> str:
        parts = []
        for a, c in self.terms:
            text = str(a)
            parts.append(text if c == 1 else f"-{text}" if c == -1 else f"{c}*{text}")
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")


IndexLike = Union[Index, int, str, DivMod]


@dataclass(frozen=True)
class Iter:
    """An iterator over the half-open range [lo, hi)."""

    name: str
    lo: int
    hi: int

    @property
    def extent(self) -> int:
        return self.hi - self.lo

    def __str__(self) -> str:
        return f"{self.name} in [{self.lo},{self.hi})"


@dataclass(frozen=True)
class Tensor:
    """An input tensor; reads outside `shape` give `pad`."""

    name: str
    shape: tuple[int, ...]
    pad: float = 0.0


@dataclass(frozen=True)
class Const:
    value: float

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class Access:
    """source[index...]: a tensor or a scope (the scope's output, materialized)."""

    source: Union[Tensor, "Scope"]
    index: tuple[Index, ...]

    def __str__(self) -> str:
        name = self.source.name if isinstance(self.source, Tensor) else "{ " + str(self.source) + " }"
        return f"{name}[{', '.join(map(str, self.index))}]"


COMMUTATIVE = {"+", "*", "max"}


@dataclass(frozen=True)
class BinOp:
    op: str                     # + - * max
    a: "Node"
    b: "Node"

    def __str__(self) -> str:
        return f"max({self.a}, {self.b})" if self.op == "max" else f"({self.a} {self.op} {self.b})"


@dataclass(frozen=True)
class Func:
    """An element-wise function of one operand (relu, tanh, ...)."""

    name: str
    arg: "Node"

    def __str__(self) -> str:
        return f"{self.name}({self.arg})"


Node = Union[Const, Access, BinOp, Func]


@dataclass(frozen=True)
class Scope:
    """L_{travs} Sum_{sums} body; output shape = traversal extents, element i of a traversal is
    iterator value lo + i; reads outside the ranges give `pad`."""

    travs: tuple[Iter, ...]
    sums: tuple[Iter, ...]
    body: Node
    pad: float = 0.0
    _hash: int = field(default=0, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "sums", tuple(sorted(self.sums, key=lambda it: it.name)))
        object.__setattr__(self, "_hash", hash((self.travs, self.sums, self.body, self.pad)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(it.extent for it in self.travs)

    @property
    def name(self) -> str:
        return f"S{self._hash & 0xffff:04x}"

    def iters(self) -> dict[str, Iter]:
        return {it.name: it for it in (*self.travs, *self.sums)}

    def __str__(self) -> str:
        head = " ".join(f"L_{{{it}}}" for it in self.travs)
        sums = " ".join(f"Sum_{{{it}}}" for it in self.sums)
        return " ".join(p for p in (head, sums, str(self.body)) if p)


def scope(travs, sums, body: Node, pad: float = 0.0) -> Scope:
    return _intern(Scope(tuple(travs), tuple(sums), body, pad))


def read(source: Union[Tensor, Scope], *index: IndexLike) -> Access:
    return _intern(Access(source, tuple(Index.of(i) for i in index)))


def mul(a: Node, b: Node) -> BinOp:
    return _intern(BinOp("*", a, b))


def add(a: Node, b: Node) -> BinOp:
    return _intern(BinOp("+", a, b))


def accesses(node: Node) -> list[Access]:
    """Every read in a body, left to right (not into nested scopes' bodies)."""
    if isinstance(node, Access):
        return [node]
    if isinstance(node, BinOp):
        return accesses(node.a) + accesses(node.b)
    if isinstance(node, Func):
        return accesses(node.arg)
    return []


def map_accesses(node: Node, fn) -> Node:
    """The body with each read replaced by fn(read)."""
    if isinstance(node, Access):
        return fn(node)
    if isinstance(node, BinOp):
        return _intern(BinOp(node.op, map_accesses(node.a, fn), map_accesses(node.b, fn)))
    if isinstance(node, Func):
        return _intern(Func(node.name, map_accesses(node.arg, fn)))
    return node


def substitute(node: Node, mapping: dict[str, Index]) -> Node:
    """The body with iterators replaced in every read's index."""
    return map_accesses(node, lambda a: read(a.source, *(i.substitute(mapping) for i in a.index)))
