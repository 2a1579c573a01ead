"""The derivation search (EinNet §6): an explorative depth-first search over the rules to a
maximum depth (7 by default), with fingerprints dropping states already seen (§6.2) and a time
budget per subprogram. A state is a candidate when every scope in it instantiates as one of the
accepted kinds (by default matmul class or memory-bound eOperator, match.py); the candidates are
what the cost model ranks.

Children are visited in order of how far their scopes are from instantiating (the summed
matmul distance of the non-eOperator scopes). A candidate's matmul scope may still hold several
iterators per group: EinNet's converging stage (converge.py) then merges them, distance-reducing
steps only, into the plain matmul the emitter builds; the pass appends those steps to the
candidate's derivation. (EinNet runs it from every explored state; here instantiation already
accepts such scopes, so it runs once on the chosen candidate's matmul scopes.)
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .expr import Scope
from .fingerprint import canonical, text_hash
from .match import Piece, instantiate
from .rules import INTRA, rewrites

MAX_DEPTH = 7


@dataclass
class Candidate:
    program: Scope
    steps: list[str]
    pieces: list[Piece]


@dataclass
class SearchResult:
    candidates: list[Candidate] = field(default_factory=list)
    states: int = 0              # states generated
    pruned: int = 0              # dropped: fingerprint already seen
    seconds: float = 0.0
    exhausted: bool = True       # False when the budget stopped it

    @property
    def pruning_rate(self) -> float:
        return self.pruned / self.states if self.states else 0.0


def _remaining(pieces: list[Piece]) -> float:
    return sum(0 if p.kind in ("eop", "conv") else p.distance for p in pieces)


def derive(expr: Scope, max_depth: int = MAX_DEPTH, seconds: float = 60.0, rules=INTRA,
           max_candidates: int = 1000, accept: tuple[str, ...] = ("matmul", "eop")) -> SearchResult:
    """Every program found within depth and budget whose scopes all instantiate as one of
    `accept` (the original excluded)."""
    result = SearchResult()
    # fingerprint -> (canonical text, depth first seen): a state met again no deeper is dropped;
    # one met shallower than before is explored again (its subtree reaches further from there)
    start = canonical(expr)
    seen: dict[int, tuple[str, int]] = {text_hash(start): (start, 0)}
    found: dict[int, Candidate] = {}
    deadline = time.perf_counter() + seconds
    t0 = time.perf_counter()

    def visit(state: Scope, steps: list[str]) -> None:
        if len(steps) >= max_depth or len(result.candidates) >= max_candidates:
            return
        children = []
        for name, child in rewrites(state, rules):
            if time.perf_counter() > deadline:
                result.exhausted = False
                return
            result.states += 1
            text, depth = canonical(child), len(steps) + 1
            fp = text_hash(text)
            old = seen.get(fp)
            if old is not None and old[0] == text and old[1] <= depth:
                result.pruned += 1
                continue
            if old is None or old[0] == text:
                seen[fp] = (text, depth)
            pieces = instantiate(child)
            if old is not None and fp in found and old[0] == text:
                found[fp].steps = [*steps, name]          # the shorter derivation of a known candidate
            elif old is None and all(p.kind in accept for p in pieces):
                found[fp] = Candidate(child, [*steps, name], pieces)
                result.candidates.append(found[fp])
            children.append((_remaining(pieces), len(children), name, child))
        for _, _, name, child in sorted(children, key=lambda c: (c[0] if c[0] < math.inf else 1e9, c[1])):
            visit(child, [*steps, name])

    visit(expr, [])
    result.seconds = time.perf_counter() - t0
    return result
