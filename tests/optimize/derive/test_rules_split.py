"""The dilation rules: a traversal split by k (v = k*v_o + v_i) and a read relayout (X[k*P + R] ->
X'[R, P]) compute the same as the expression they rewrite on random strided and dilated convs,
refuse expressions with no k-step, and the search finds EinNet's dilated -> non-dilated rewrite:
a plain conv over (h_o + r, w_o + s), batched over the 2 x 2 phases."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from packager.optimize.derive.expr import accesses
from packager.optimize.derive.interp import evaluate
from packager.optimize.derive.operators import conv2d, matmul
from packager.optimize.derive.rules_split import DILATION, read_relayout, traversal_split
from packager.optimize.derive.search import derive


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 2), st.integers(1, 3),
       st.integers(0, 2), st.integers(0, 2**16))
def test_split_and_relayout_compute_the_same(c, f, k, stride, dil, pad, seed):
    h = dil * (k - 1) + 1 + pad + 2
    expr = conv2d((1, c, h, h + 1), (f, c, k, k), (stride, stride), (pad,) * 4, (dil, dil))
    rng = np.random.default_rng(seed)
    inputs = {"X": rng.standard_normal((1, c, h, h + 1)), "W": rng.standard_normal((f, c, k, k))}
    want = evaluate(expr, inputs)
    state = expr
    for _ in range(3):                              # a split, then rules on what it made
        steps = list(traversal_split(state)) + list(read_relayout(state))
        for name, child in steps:
            np.testing.assert_allclose(evaluate(child, inputs), want, atol=1e-10, err_msg=name)
        if not steps:
            break
        state = steps[seed % len(steps)][1]


def test_no_k_step_no_rewrite():
    assert list(traversal_split(matmul(4, 5, 6))) == list(read_relayout(matmul(4, 5, 6))) == []
    plain = conv2d((1, 2, 6, 6), (2, 2, 3, 3), pads=(1, 1, 1, 1))
    assert list(traversal_split(plain)) == list(read_relayout(plain)) == []
    strided = conv2d((1, 2, 6, 6), (2, 2, 3, 3), strides=(2, 2))     # space-to-depth: relayout only
    assert list(traversal_split(strided)) == [] and len(list(read_relayout(strided))) == 1


def test_dilated_conv_derives_to_a_batched_plain_conv():
    expr = conv2d((1, 16, 12, 12), (16, 16, 3, 3), pads=(2, 2, 2, 2), dilations=(2, 2))
    result = derive(expr, max_depth=4, seconds=60, rules=DILATION, accept=("conv", "eop"))
    assert result.exhausted and result.pruned > 0

    def plain_conv_over_phases(c):
        convs = [p.scope for p in c.pieces if p.kind == "conv"]
        if len(convs) != 1:
            return False
        (x,) = [a for a in accesses(convs[0].body) if a.source.shape != (16, 16, 3, 3)]
        spatial = [sorted(n for n, _ in i.terms) for i in x.index if len(i.terms) == 2]
        return spatial == [["ho", "r"], ["s", "wo"]]

    hits = sorted((c for c in result.candidates if plain_conv_over_phases(c)), key=lambda c: len(c.steps))
    assert hits and [s.split()[0] + s.split()[1] for s in hits[0].steps] == ["R2split", "R2split", "DLTX"]
    rng = np.random.default_rng(0)
    inputs = {"X": rng.standard_normal((1, 16, 12, 12)), "W": rng.standard_normal((16, 16, 3, 3))}
    np.testing.assert_allclose(evaluate(hits[0].program, inputs), evaluate(expr, inputs), atol=1e-10)
