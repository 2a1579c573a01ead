"""The converging stage drives a matmul-class scope to a plain matmul: the distance (iterators
beyond one per group) starts above 0 on the Conv3x3 derivation's inner scope (EinNet's E6) and
every step lowers it by exactly one to 0, each step's values being the original's reshaped; a
merge that would need more than a reshape is refused."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from packager.optimize.derive.converge import converge, distance, matmul_shape, merge
from packager.optimize.derive.expr import Iter, Tensor, mul, read, scope
from packager.optimize.derive.interp import evaluate
from packager.optimize.derive.layout import to_gemm_layout
from packager.optimize.derive.match import instantiate, matmul_distance
from packager.optimize.derive.operators import conv2d
from packager.optimize.derive.search import derive


def _e6(c: int = 8, f: int = 4, hw: int = 7):
    """The Conv3x3 derivation's matmul scope (R1, R2 x2, R5 x2) in GEMM layout, and its program."""
    result = derive(conv2d((1, c, hw, hw), (f, c, 3, 3), pads=(1, 1, 1, 1)), seconds=60)
    for cand in sorted(result.candidates, key=lambda c: len(c.steps)):
        program, relaid = to_gemm_layout(cand.program, {"W"})
        mm = [p.scope for p in instantiate(program) if p.kind == "matmul"]
        if len(mm) == 1 and converge(mm[0]) is not None:
            return mm[0], relaid
    raise AssertionError("no Conv3x3 candidate converges")


def _check_steps(original, inputs):
    steps = converge(original)
    assert steps and distance(original) == matmul_distance(original) > 0
    want = evaluate(original, inputs)
    previous = distance(original)
    for step in steps:
        assert step.distance == previous - 1
        previous = step.distance
        np.testing.assert_allclose(evaluate(step.scope, inputs).reshape(want.shape), want, atol=1e-10)
    assert previous == 0
    return steps


def test_conv3x3_inner_scope_converges_to_a_matmul():
    rng = np.random.default_rng(0)
    mm, relaid = _e6()
    weight = rng.standard_normal((4, 8, 3, 3))
    inputs = {"X": rng.standard_normal((1, 8, 7, 7)), "W": weight}
    inputs |= {name: np.transpose(weight, r.perm) for name, r in relaid.items()}
    steps = _check_steps(mm, inputs)
    assert [s.name.split(" -> ")[1] for s in steps] == ["m", "m", "n", "n"]      # t1, t2 (and n) -> m; r, s, f -> n
    assert matmul_shape(mm) == (None, 49, 8, 36)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 3), st.integers(0, 2**16))
def test_batched_matmul_with_split_groups_converges(b, m1, m2, k1, k2, n, seed):
    rng = np.random.default_rng(seed)
    A, B = Tensor("A", (b, m1, m2, k1, k2)), Tensor("B", (b, k1, k2, n))
    s = scope([Iter("b", 0, b), Iter("m1", 0, m1), Iter("m2", 0, m2), Iter("n", 0, n)],
              [Iter("k1", 0, k1), Iter("k2", 0, k2)],
              mul(read(A, "b", "m1", "m2", "k1", "k2"), read(B, "b", "k1", "k2", "n")))
    _check_steps(s, {"A": rng.standard_normal(A.shape), "B": rng.standard_normal(B.shape)})
    assert matmul_shape(s) == (b, m1 * m2, k1 * k2, n)


def test_a_merge_that_is_no_reshape_is_refused():
    A, B = Tensor("A", (3, 4, 5)), Tensor("B", (4, 2))
    its = [Iter("m1", 0, 3), Iter("m2", 0, 5), Iter("n", 0, 2)]
    apart = scope(its, [Iter("k", 0, 4)], mul(read(A, "m1", "k", "m2"), read(B, "k", "n")))   # k between m1, m2
    assert distance(apart) == 1 and merge(apart, "m1", "m2") is None and converge(apart) is None
    A2 = Tensor("A2", (3, 5, 4))
    swapped = scope(its, [Iter("k", 0, 4)], mul(read(A2, "m2", "m1", "k"), read(B, "k", "n")))
    assert merge(swapped, "m1", "m2") is None                       # m2 before m1 in A2
    shifted = scope([Iter("m1", 1, 3), *its[1:]], [Iter("k", 0, 4)],
                    mul(read(Tensor("A3", (3, 5, 4)), "m1", "m2", "k"), read(B, "k", "n")))
    assert merge(shifted, "m1", "m2") is None                       # m1 does not start at 0
