"""The derivation search finds the digest's golden derivations from the original operators
within MaxDepth 7 (shortest derivation reported), classifies the derived scopes (matmul class vs
memory-bound eOperator), and prunes repeated states by fingerprint."""
from __future__ import annotations

import numpy as np

from packager.optimize.derive.fingerprint import canonical
from packager.optimize.derive.interp import evaluate
from packager.optimize.derive.match import groups, instantiate, intensity, matmul_distance
from packager.optimize.derive.operators import conv2d, conv_transpose2d, matmul
from packager.optimize.derive.search import MAX_DEPTH, derive


def _matmul_plus_offset_reduce(c, extent: int):
    """One matmul-class scope summing only over input channels, whose two substituted traversals
    were tightened to `extent` (a conv's input size, a conv transpose's kernel size), read by one
    memory-bound reduce."""
    kinds = sorted(p.kind for p in c.pieces)
    if kinds != ["eop", "matmul"]:
        return False
    mm = next(p.scope for p in c.pieces if p.kind == "matmul")
    g = groups(mm)
    offsets = [it for it in mm.travs if it.name.startswith("t")]
    return g["k"] == ["c"] and not g.get("batch") and [(i.lo, i.hi) for i in offsets] == [(0, extent)] * 2


def _golden(expr, extent, inputs):
    result = derive(expr, MAX_DEPTH, seconds=60)
    hits = sorted((c for c in result.candidates if _matmul_plus_offset_reduce(c, extent)), key=lambda c: len(c.steps))
    assert hits, f"{len(result.candidates)} candidates, none matmul + offset reduce"
    np.testing.assert_allclose(evaluate(hits[0].program, inputs), evaluate(expr, inputs), atol=1e-10)
    return result, hits[0]


def test_conv3x3_derives_to_matmul_plus_offset_reduce():
    rng = np.random.default_rng(0)
    expr = conv2d((1, 8, 7, 7), (4, 8, 3, 3), pads=(1, 1, 1, 1))
    inputs = {"X": rng.standard_normal((1, 8, 7, 7)), "W": rng.standard_normal((4, 8, 3, 3))}
    result, best = _golden(expr, 7, inputs)
    assert [s.split()[0] for s in best.steps] == ["R1", "R2", "R2", "R5", "R5"]
    assert result.pruned > 0 and 0 < result.pruning_rate < 1 and result.exhausted


def test_conv_transpose_k4_s2_p1_derives_to_matmul_plus_selective_reduce():
    rng = np.random.default_rng(1)
    expr = conv_transpose2d((1, 6, 3, 3), (6, 2, 4, 4), (2, 2), (1, 1, 1, 1))
    inputs = {"X": rng.standard_normal((1, 6, 3, 3)), "W": rng.standard_normal((6, 2, 4, 4))}
    _, best = _golden(expr, 4, inputs)
    assert len(best.steps) == 5


def test_matmul_class_and_eoperators():
    mm = matmul(8, 16, 8)
    assert groups(mm) == {"m": ["m"], "n": ["n"], "k": ["k"]} and matmul_distance(mm) == 0
    assert [p.kind for p in instantiate(mm)] == ["matmul"]
    conv = conv2d((1, 8, 7, 7), (4, 8, 3, 3), pads=(1, 1, 1, 1))
    assert matmul_distance(conv) == float("inf")         # h + r mixes an m and a k iterator in one dimension
    assert intensity(conv) > 4


def test_the_budget_stops_the_search():
    expr = conv2d((1, 4, 5, 5), (3, 4, 3, 3), pads=(1, 1, 1, 1))
    result = derive(expr, MAX_DEPTH, seconds=0.0)
    assert not result.exhausted and result.candidates == []
    assert canonical(expr)                                 # the input is untouched
