"""derive's expression IR: the interpreter computes ONNX's Conv / ConvTranspose / MatMul exactly
(it is the oracle for every rule), nodes are interned, the printer writes the paper's notation,
and fingerprints identify expressions up to the four redundancies of EinNet §6.2."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings, strategies as st

from packager.optimize.derive.expr import Index, Iter, Tensor, mul, read, scope
from packager.optimize.derive.fingerprint import canonical, fingerprint
from packager.optimize.derive.interp import evaluate
from packager.optimize.derive.operators import conv2d, conv_transpose2d, matmul


@st.composite
def conv_cases(draw):
    group = draw(st.sampled_from([1, 2]))
    c, f = group * draw(st.integers(1, 3)), group * draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    strides, dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2))), (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h = draw(st.integers(dil[0] * (kh - 1) + 1, 7))
    w = draw(st.integers(dil[1] * (kw - 1) + 1, 7))
    return (draw(st.integers(1, 2)), c, h, w), (f, c // group, kh, kw), strides, pads, dil, group


@settings(max_examples=40, deadline=None)
@given(conv_cases(), st.integers(0, 2**16))
def test_conv_is_onnx_conv(case, seed):
    data, weight, strides, pads, dil, group = case
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal(data), rng.standard_normal(weight)
    got = evaluate(conv2d(data, weight, strides, pads, dil, group), {"X": x, "W": w})
    padded = torch.nn.functional.pad(torch.tensor(x), (pads[1], pads[3], pads[0], pads[2]))
    ref = torch.nn.functional.conv2d(padded, torch.tensor(w), stride=strides, dilation=dil, groups=group).numpy()
    np.testing.assert_allclose(got, ref, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 2),
       st.integers(0, 1), st.integers(0, 2**16))
def test_conv_transpose_is_onnx_conv_transpose(c, f, h, k, stride, pad, seed):
    rng = np.random.default_rng(seed)
    k = max(k, 2 * pad + 1)                     # at least one output row
    x, w = rng.standard_normal((1, c, h, h)), rng.standard_normal((c, f, k, k))
    got = evaluate(conv_transpose2d(x.shape, w.shape, (stride, stride), (pad,) * 4), {"X": x, "W": w})
    ref = torch.nn.functional.conv_transpose2d(torch.tensor(x), torch.tensor(w), stride=stride, padding=pad).numpy()
    np.testing.assert_allclose(got, ref, atol=1e-12)


def test_matmul_and_nested_scope_reads_with_offsets_and_padding():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    mm = matmul(3, 4, 5)
    np.testing.assert_allclose(evaluate(mm, {"A": a, "B": b}), a @ b)
    # a nested scope over [1, 4) read at m - 1: row 0 reads below its range -> its padding (0)
    inner = scope([Iter("i", 1, 4), Iter("n", 0, 5)], [], read(mm, Index.of("i") - 1, "n"))
    outer = scope([Iter("m", 0, 3), Iter("n", 0, 5)], [], read(inner, Index.of("m"), "n"))
    want = np.vstack([np.zeros((1, 5)), (a @ b)[:2]])
    np.testing.assert_allclose(evaluate(outer, {"A": a, "B": b}), want)


def test_nodes_are_interned_and_print_in_the_papers_notation():
    assert conv2d((1, 2, 4, 4), (3, 2, 3, 3), pads=(1, 1, 1, 1)) is conv2d((1, 2, 4, 4), (3, 2, 3, 3), pads=(1, 1, 1, 1))
    text = str(matmul(2, 3, 4))
    assert text == "L_{m in [0,2)} L_{n in [0,4)} Sum_{k in [0,3)} (A[m, k] * B[k, n])"
    assert str(Index.of("h") * 2 + Index.of("r") - 1) == "2*h + r - 1"


def _mm(a_idx, b_idx, travs=("m", "n"), sums=("k", "q"), a="A", b="B"):
    A, B = Tensor(a, (4, 4)), Tensor(b, (4, 4))
    its = {n: Iter(n, 0, 4) for n in "mnkqxy"}
    return scope([its[t] for t in travs], [its[s] for s in sums], mul(read(A, *a_idx), read(B, *b_idx)))


def test_fingerprint_ignores_summation_order_operand_order_and_names():
    base = _mm(("m", "k"), ("q", "n"))
    renamed = _mm(("x", "q"), ("k", "y"), travs=("x", "y"), sums=("q", "k"))     # names and sum order
    A, B = Tensor("A", (4, 4)), Tensor("B", (4, 4))
    swapped = scope(base.travs, base.sums, mul(read(B, "q", "n"), read(A, "m", "k")))
    assert fingerprint(base) == fingerprint(renamed) == fingerprint(swapped)
    assert canonical(base) == canonical(renamed)


def test_fingerprint_keeps_traversal_order_and_which_summation_goes_where():
    base = _mm(("m", "k"), ("q", "n"))
    transposed = _mm(("m", "k"), ("q", "n"), travs=("n", "m"))
    assert fingerprint(base) != fingerprint(transposed)
    same_sum_twice = _mm(("m", "k"), ("k", "n"), sums=("k", "q"))
    assert fingerprint(base) != fingerprint(same_sum_twice)


def test_a_scope_hashes_as_the_expression_that_produces_it():
    inner = matmul(4, 4, 4)
    outer1 = scope([Iter("i", 0, 4), Iter("j", 0, 4)], [], read(inner, "j", "i"))
    A, B = Tensor("A", (4, 4)), Tensor("B", (4, 4))
    inner2 = scope([Iter("x", 0, 4), Iter("y", 0, 4)], [Iter("z", 0, 4)], mul(read(B, "z", "y"), read(A, "x", "z")))
    assert inner2 is not inner
    outer2 = scope([Iter("u", 0, 4), Iter("v", 0, 4)], [], read(inner2, "v", "u"))
    assert fingerprint(outer1) == fingerprint(outer2)
