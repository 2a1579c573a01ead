"""ALT layout primitives: Table 1 shapes and accesses, the paper's examples, unfold and Eq. 1,
round trips, and agreement with TVM's IndexMap."""
from __future__ import annotations

import numpy as np
import pytest
import tvm

from packager.optimize.layout.primitives import (Fuse, LayoutSeq, Pad, Reorder, Split, Unfold, channel_blocked,
                                                 conv_weight_blocked)

RNG = np.random.default_rng(0)


def _check_bijection(seq: LayoutSeq) -> None:
    a = RNG.standard_normal(seq.logical).astype(np.float32)
    packed = seq.apply_np(a)
    assert packed.shape == seq.shape()
    np.testing.assert_array_equal(seq.invert_np(packed), a)
    grid = np.indices(seq.logical).reshape(len(seq.logical), -1)
    np.testing.assert_array_equal(packed[tuple(seq.fwd(list(grid)))], a.reshape(-1))   # fwd = where it went
    np.testing.assert_array_equal(np.array(seq.inv(seq.fwd(list(grid)))), grid)          # inv o fwd = id


def test_paper_example_nohw_to_blocked():
    """NOHW -> N(O/o_t)HW o_t = split(dim O, [O/o_t, o_t]) then reorder (ALT §3)."""
    seq = LayoutSeq((2, 32, 5, 6), (Split(1, (2, 16)), Reorder((0, 1, 3, 4, 2))))
    assert seq.shape() == (2, 2, 5, 6, 16)
    assert seq.fwd([1, 19, 3, 4]) == [1, 1, 3, 4, 3]
    assert seq == channel_blocked((2, 32, 5, 6), 1, 16)
    _check_bijection(seq)


def test_paper_example_nhwo_fuse_split_reorder():
    """NHWO -> N(O/4)(HW)4 via fuse, split of the fused dim, reorder; the access formula of §3."""
    n, h, w, o = 2, 3, 5, 8
    seq = LayoutSeq((n, h, w, o), (Fuse((1, 2, 3)), Split(1, (o // 4, 4, h * w)), Reorder((0, 1, 3, 2))))
    assert seq.shape() == (n, o // 4, h * w, 4)
    for idx in [(1, 2, 4, 7), (0, 0, 0, 0), (1, 1, 3, 2)]:
        e = idx[1] * w * o + idx[2] * o + idx[3]
        assert seq.fwd(list(idx)) == [idx[0], e // (h * w * 4), e % (h * w), (e // (h * w)) % 4]
    _check_bijection(seq)


def test_weight_template_matches_relax_packed_kernel_layout():
    """OIHW -> (O/o)(I/i) KH KW i o, the layout Relax calls OIHW{i}i{o}o."""
    seq = conv_weight_blocked((32, 48, 3, 3), 16, 8)
    assert seq.shape() == (4, 3, 3, 3, 16, 8)
    a = RNG.standard_normal((32, 48, 3, 3)).astype(np.float32)
    ref = a.reshape(4, 8, 3, 16, 3, 3).transpose(0, 2, 4, 5, 3, 1)
    np.testing.assert_array_equal(seq.apply_np(a), ref)
    _check_bijection(seq)


@pytest.mark.parametrize("seed", range(6))
def test_random_sequences_round_trip_and_match_index_map(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(x) for x in rng.choice([2, 3, 4, 6], size=3))
    dim = int(rng.integers(0, 3))
    f = 2 if shape[dim] % 2 == 0 else shape[dim]
    prims = [Split(dim, (shape[dim] // f, f))]
    perm = tuple(int(x) for x in rng.permutation(4))
    prims.append(Reorder(perm))
    prims.append(Fuse((0, 1)))
    seq = LayoutSeq(shape, tuple(prims))
    _check_bijection(seq)
    im = seq.index_map()
    assert [int(x) for x in im.map_shape(list(shape))] == list(seq.shape())
    for idx in np.ndindex(shape):
        assert [int(x) for x in im.map_indices([tvm.tirx.const(i, "int32") for i in idx])] == seq.fwd(list(idx))


def test_pad_then_split_zero_fills_and_unpads():
    seq = LayoutSeq((30, 5), (Pad(0, 32), Split(0, (4, 8))))
    a = RNG.standard_normal((30, 5)).astype(np.float32)
    p = seq.apply_np(a)
    assert p.shape == (4, 8, 5) and np.all(p.reshape(32, 5)[30:] == 0)
    np.testing.assert_array_equal(seq.invert_np(p), a)
    with pytest.raises(ValueError, match="pad first"):
        LayoutSeq((30,), (Split(0, (4, 8)),)).shape()


@pytest.mark.parametrize("seed", range(8))
def test_packing_by_numpy_steps_matches_the_index_definition(seed):
    """apply_np (reshape / transpose / pad per primitive) = gather_np (inv() of every element)."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(x) for x in rng.choice([3, 4, 6, 10], size=3))
    dim = int(rng.integers(0, 3))
    size = shape[dim] + shape[dim] % 2 + int(rng.integers(0, 3)) * 2
    padded = shape[:dim] + (size,) + shape[dim + 1:]
    prims = (Pad(dim, size), Split(dim, (size // 2, 2)), Reorder(tuple(int(x) for x in rng.permutation(4))),
             Fuse((1, 2)))
    seq = LayoutSeq(shape, prims)
    a = rng.standard_normal(shape).astype(np.float32)
    packed = seq.apply_np(a)
    assert packed.flags.c_contiguous and packed.dtype == a.dtype
    np.testing.assert_array_equal(packed, seq.gather_np(a))
    assert LayoutSeq(shape, prims[:1]).apply_np(a).shape == padded


def test_unfold_paper_example_and_size():
    seq = LayoutSeq((5,), (Unfold(0, 3, 2),))
    assert seq.shape() == (2, 3)
    np.testing.assert_array_equal(seq.apply_np(np.arange(1, 6)), [[1, 2, 3], [3, 4, 5]])
    np.testing.assert_array_equal(seq.invert_np(seq.apply_np(np.arange(1, 6))), np.arange(1, 6))
    for d, b, s in [(10, 4, 2), (11, 4, 3), (224, 9, 4)]:
        assert Unfold(0, b, s).shape((d,)) == (-(-(d - b) // s) + 1, b)
    assert not seq.is_bijective
    with pytest.raises(ValueError, match="producer stage"):
        seq.index_map()


@pytest.mark.parametrize("seed", range(8))
def test_eq1_window_access_in_unfolded_input(seed):
    """ALT Eq. 1: a sliding-window read T[V*i + r] finds the same element in the unfolded tensor
    (tile = (h_t - 1) V + M, stride = h_t V: each tile holds the windows of h_t outputs)."""
    rng = np.random.default_rng(seed)
    v, m, h_t = int(rng.integers(1, 4)), int(rng.integers(1, 6)), int(rng.integers(1, 5))
    outs = h_t * int(rng.integers(1, 5))
    d = (outs - 1) * v + m
    t = np.arange(d, dtype=np.float32) * 3 + 1
    u = Unfold(0, (h_t - 1) * v + m, h_t * v)
    packed = LayoutSeq((d,), (u,)).apply_np(t)
    for i in range(outs):
        for r in range(m):
            tile, off = u.window_access(i, r, v, m)
            assert packed[tile, off] == t[v * i + r], (v, m, h_t, i, r)
