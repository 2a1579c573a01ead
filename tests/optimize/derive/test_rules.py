"""EinNet's rules R1, R2 (+R4 relaxing), R3, R5: every rewrite at every legal site computes the
same as the expression it came from (numpy oracle, random shapes and data, non-zero up to the
borders), and each rule refuses the sites its precondition excludes."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from packager.optimize.derive.expr import Index, Iter, Tensor, mul, read, scope
from packager.optimize.derive.interp import evaluate
from packager.optimize.derive.operators import conv2d, conv_transpose2d, matmul
from packager.optimize.derive.rules import (boundary_tighten, rewrites, summation_split, traversal_merge,
                                            variable_substitution)


def _inputs(expr, rng):
    from packager.optimize.derive.expr import accesses
    out = {}

    def visit(s):
        for a in accesses(s.body):
            if isinstance(a.source, Tensor):
                out[a.source.name] = rng.standard_normal(a.source.shape)
            else:
                visit(a.source)
    visit(expr)
    return out


@st.composite
def programs(draw):
    kind = draw(st.sampled_from(["conv", "conv", "convT", "matmul"]))
    if kind == "matmul":
        return matmul(draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    c, f, k = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    h = draw(st.integers(k, 5))
    stride, pad = draw(st.integers(1, 2)), draw(st.integers(0, k - 1))
    if kind == "convT":
        return conv_transpose2d((1, c, h, h), (c, f, k, k), (stride, stride), (pad,) * 4)
    return conv2d((1, c, h, h), (f, c, k, k), (stride, stride), (pad,) * 4)


@settings(max_examples=30, deadline=None)
@given(programs(), st.lists(st.integers(0, 10**6), min_size=1, max_size=4), st.integers(0, 2**16))
def test_random_derivations_compute_the_same(expr, picks, seed):
    """A random walk of up to 4 rewrites; every step (every legal site listed) is checked."""
    rng = np.random.default_rng(seed)
    inputs = _inputs(expr, rng)
    want = evaluate(expr, inputs)
    state = expr
    for pick in picks:
        steps = list(rewrites(state))
        if not steps:
            break
        for name, child in steps:
            np.testing.assert_allclose(evaluate(child, inputs), want, atol=1e-10, err_msg=f"{name}\n{state}")
        state = steps[pick % len(steps)][1]


def _conv3x3():
    return conv2d((1, 3, 5, 4), (2, 3, 3, 3), pads=(1, 1, 1, 1))


def _rule_sites(expr):
    return {name.split()[0] for name, _ in rewrites(expr)}


def test_every_rule_fires_on_the_conv3x3_derivation():
    e1 = dict(summation_split(_conv3x3()))["R1 split Sum_{c}"]
    assert {"R2", "R3"} <= _rule_sites(e1)
    e2 = next(s for n, s in rewrites(e1) if n.startswith("R2 h"))
    assert "R5" in _rule_sites(e2)


def test_summation_split_needs_two_summations():
    assert list(summation_split(matmul(2, 3, 4))) == []
    assert len(list(summation_split(_conv3x3()))) == 6          # proper non-empty subsets of {c, r, s}


def _reader(inner, index, travs):
    return scope(travs, [], read(inner, *index))


def test_merge_refuses_a_read_outside_the_nested_scope():
    """The nested scope's padding (0) is read at m = 3; inlining would compute A[3, k] = padding too,
    but the rule does not rely on that: a read outside the ranges is refused."""
    mm = matmul(3, 2, 2)
    inside = _reader(mm, ["m", "n"], [Iter("m", 0, 3), Iter("n", 0, 2)])
    outside = _reader(mm, ["m", "n"], [Iter("m", 0, 4), Iter("n", 0, 2)])
    assert len(list(traversal_merge(inside))) == 1
    assert list(traversal_merge(outside)) == []


def test_substitution_refuses_non_unimodular_maps_and_readers_relying_on_padding():
    X = Tensor("X", (9,))
    inner = scope([Iter("a", 0, 3), Iter("b", 0, 3)], [], read(X, Index.of("a") * 3 + Index.of("b") * 2))
    ok = scope([Iter("a", 0, 3), Iter("b", 0, 3)], [], read(inner, "a", "b"))
    assert list(variable_substitution(ok)) == []                 # coefficients 3 and 2: neither is unimodular
    unit = scope([Iter("a", 0, 3), Iter("b", 0, 3)], [], read(X, Index.of("a") + Index.of("b") * 2))
    assert [n for n, _ in variable_substitution(_reader(unit, ["a", "b"], ok.travs))] == ["R2 a -> a + 2*b"]
    padded = _reader(unit, [Index.of("a") - 1, "b"], ok.travs)     # a - 1 = -1 reads the padding
    assert list(variable_substitution(padded)) == []


def test_tightening_needs_a_zero_padded_factor_and_a_zero_padded_scope():
    e2 = next(s for n, s in rewrites(dict(summation_split(_conv3x3()))["R1 split Sum_{c}"]) if n.startswith("R2 h"))
    assert [n for n, _ in boundary_tighten(e2)] == ["R5 tighten t0 to [0,5)"]
    X1 = Tensor("X", (5,), pad=1.0)                              # padding 1: the body is not 0 outside
    inner = scope([Iter("t", -1, 6)], [], mul(read(X1, "t"), read(Tensor("W", (1,)), 0)))
    assert list(boundary_tighten(_reader(inner, ["h"], [Iter("h", 0, 5)]))) == []
    X0 = Tensor("X", (5,))
    inner = scope([Iter("t", -1, 6)], [], mul(read(X0, "t"), read(Tensor("W", (1,)), 0)), pad=2.0)
    assert list(boundary_tighten(_reader(inner, ["h"], [Iter("h", 0, 5)]))) == []
