"""Inter-expression rules: R7 merges sibling matmuls on a shared input into one matmul on the
concatenated weights (EinNet's Fig. 3a), R6 splits an expression and R8 inlines a producer into its
consumer; every old output's values are where the rule says, and expressions that differ in more
than one tensor are not merged, nor is a producer fused where its values or padding would change."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from packager.optimize.derive.expr import Func, Index, Iter, Tensor, mul, read, scope
from packager.optimize.derive.inter import fuse, merge, split
from packager.optimize.derive.interp import evaluate
from packager.optimize.derive.match import instantiate, matmul_distance
from packager.optimize.derive.operators import matmul


def _mm(m, k, n, a="A", b="B"):
    return matmul(m, k, n, a=a, b=b)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.integers(1, 5), st.integers(1, 5), st.integers(0, 2**16))
def test_sibling_matmuls_merge_into_one(m, k, n1, n2, seed):
    rng = np.random.default_rng(seed)
    inputs = {"A": rng.standard_normal((m, k)), "B1": rng.standard_normal((k, n1)), "B2": rng.standard_normal((k, n2))}
    outputs = {"y1": _mm(m, k, n1, b="B1"), "y2": _mm(m, k, n2, b="B2")}
    (name, merged, where), = list(merge(outputs))
    (single,) = merged.values()
    assert name == "R7 merge y1 + y2 along n"
    value = evaluate(single, inputs)
    for old, (new, pos, (lo, hi)) in where.items():
        assert pos == 1 and new == "y1+y2"
        np.testing.assert_allclose(value[:, lo:hi], evaluate(outputs[old], inputs), atol=1e-12)
    assert matmul_distance(single) == 0                          # one matmul, weights concatenated
    assert [p.kind for p in instantiate(single)][0] == "eop"    # the concatenation (weights only)


def test_expressions_that_differ_in_two_tensors_or_their_math_are_not_merged():
    assert list(merge({"y1": _mm(3, 4, 5, a="A1", b="B1"), "y2": _mm(3, 4, 5, a="A2", b="B2")})) == []
    A, B1, B2 = Tensor("A", (3, 4)), Tensor("B1", (4, 5)), Tensor("B2", (4, 5))
    its = [Iter("m", 0, 3), Iter("n", 0, 5)]
    plain = scope(its, [Iter("k", 0, 4)], mul(read(A, "m", "k"), read(B1, "k", "n")))
    transposed = scope(its, [Iter("k", 0, 4)], mul(read(A, "m", "k"), read(B2, "n", "k")))   # other index
    assert list(merge({"y1": plain, "y2": transposed})) == []


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**16))
def test_split_pieces_hold_the_original_values(m, k, n, seed):
    rng = np.random.default_rng(seed)
    inputs = {"A": rng.standard_normal((m, k)), "B": rng.standard_normal((k, n))}
    y = _mm(m, k, n)
    want = evaluate(y, inputs)
    assert len(list(split({"y": y}))) == (m >= 2) + (n >= 2)
    for name, outputs, where in split({"y": y}):
        pos, (first, second) = where["y"]
        halves = [evaluate(outputs[first], inputs), evaluate(outputs[second], inputs)]
        np.testing.assert_allclose(np.concatenate(halves, axis=pos), want, atol=1e-12)


def test_split_refuses_a_traversal_of_extent_one():
    y = _mm(1, 3, 4)
    assert [name for name, _, _ in split({"y": y})] == ["R6 split y at n = 2"]      # m has extent 1


def _offset_reduce(f: int, h: int, w: int) :
    """y[f, h, w] = sum_r Z[r, f, h + r - 1, w] (an OffsetReduce over three offsets, zero padded)."""
    Z = Tensor("Z", (3, f, h, w))
    return scope([Iter("f", 0, f), Iter("h", 0, h), Iter("w", 0, w)], [Iter("r", 0, 3)],
                 read(Z, "r", "f", Index.of("h") + "r" - 1, "w"))


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 5), st.integers(0, 2**16))
def test_fusion_inlines_the_producer_exactly(f, h, w, seed):
    """OffsetReduce -> Relu, and a consumer that reads the producer shifted into its zero padding."""
    rng = np.random.default_rng(seed)
    inputs = {"Z": rng.standard_normal((3, f, h, w)) + 1.0}             # non-zero at every border
    producer = _offset_reduce(f, h, w)
    y = Tensor("y", (f, h, w))
    its = [Iter("f", 0, f), Iter("h", 0, h), Iter("w", 0, w)]
    relu = scope(its, [], Func("relu", read(y, "f", "h", "w")))
    shifted = scope(its, [], mul(read(y, "f", Index.of("h") + 1, "w"), read(y, "f", "h", "w")))
    for consumer in (relu, shifted):
        outputs = {"y": producer, "z": consumer}
        (name, fused, where), = list(fuse(outputs))
        assert name == "R8 fuse y into z" and list(fused) == ["z"] and where == {"z": "z"}
        produced = evaluate(producer, inputs)
        np.testing.assert_allclose(evaluate(fused["z"], inputs), evaluate(consumer, inputs | {"y": produced}),
                                   atol=1e-12)
    assert [p.kind for p in instantiate(fuse({"y": producer, "z": relu}).__next__()[1]["z"])] == ["eop", "eop"]


def test_fusion_refuses_inexact_or_unrelated_expressions():
    producer = _offset_reduce(2, 3, 3)
    its = [Iter("f", 0, 2), Iter("h", 0, 3), Iter("w", 0, 3)]
    relu_of = lambda t: scope(its, [], Func("relu", read(t, "f", "h", "w")))     # noqa: E731
    assert list(fuse({"y": producer, "z": relu_of(Tensor("x", (2, 3, 3)))})) == []       # independent
    assert list(fuse({"y": producer, "z": relu_of(Tensor("y", (2, 3, 3), pad=1.0))})) == []  # pads differ
    piece = scope([Iter("f", 0, 2), Iter("h", 1, 4), Iter("w", 0, 3)], producer.sums, producer.body)
    assert list(fuse({"y": piece, "z": relu_of(Tensor("y", (2, 3, 3)))})) == []          # an R6 piece
    # a producer another expression still reads stays an output
    (_, fused, _), *_ = list(fuse({"y": producer, "z": relu_of(Tensor("y", (2, 3, 3))),
                                  "u": relu_of(Tensor("y", (2, 3, 3)))}))
    assert set(fused) == {"y", "z", "u"}
