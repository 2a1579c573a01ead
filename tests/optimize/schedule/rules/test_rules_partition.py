"""Injective kernels that select an input by position, cut apart there (rules/partition.py): where
the cuts are read from, which kernels are cut, and that every cut kernel computes what the plain
loops do."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import s_tir, te, topi

from packager.optimize.schedule.rules.cpu import CpuRules
from packager.optimize.schedule.rules.partition import cut_points
from support.kernel_cases import host_target, run_kernel


def _head(rows=(80, 4), cols=(1600, 400, 100)):
    """A detection head's decode: scales concatenated along the last axis, a sigmoid over the
    class rows, the box rows concatenated on top (YOLO's output)."""
    scales = [te.placeholder((rows[0], c), name=f"s{i}") for i, c in enumerate(cols)]
    box = te.placeholder((rows[1], sum(cols)), name="box")
    cls = topi.sigmoid(topi.concatenate(scales, axis=1))
    return te.create_prim_func([*scales, box, topi.concatenate([box, cls], axis=0)])


def _pad(shape=(1, 16, 56, 56)):
    x = te.placeholder(shape, name="x")
    return te.create_prim_func([x, topi.nn.pad(x, [0, 0, 1, 1], [0, 0, 1, 1])])


def _block(func):
    sch = s_tir.Schedule(func)
    rules = CpuRules(host_target())
    return sch, rules._inline_stages(sch)


def test_cuts_are_read_from_the_select_conditions():
    sch, (blk,) = _block(_head())
    stmt = sch.get(blk)
    cuts = cut_points(stmt.body.value, [iv.var for iv in stmt.iter_vars], [84, 2100])
    assert cuts == {0: [4], 1: [1600, 2000]}


def _run(func, scheduled, target, rng):
    args = [rng.standard_normal([int(d) for d in p.shape]).astype("float32") for p in func.params]
    want = run_kernel(func, target, [a.copy() for a in args])
    return run_kernel(scheduled, target, args), want


@pytest.mark.parametrize("cols", [(1600, 400, 100), (64, 32, 32)])
def test_a_concat_head_is_cut_and_exact(cols):
    target = host_target()
    rules = CpuRules(target)
    func = _head(cols=cols)
    scheduled, info = rules.schedule(func)
    assert info.rule == "injective" and info.parts == 2 * len(cols) and info.vector >= 4
    assert "parts at its selects" in info.summary()
    got, want = _run(func, scheduled, target, np.random.default_rng(0))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_kernels_whose_parts_are_too_short_for_a_vector_keep_the_plain_rule():
    """A pad's borders are one element wide: its innermost axis stays whole, and 58 columns have
    no common vector width of 4 or more, so the plain rule schedules it."""
    target = host_target()
    rules = CpuRules(target)
    func = _pad()
    scheduled, info = rules.schedule(func)
    assert info.rule == "injective" and info.parts == 1
    got, want = _run(func, scheduled, target, np.random.default_rng(1))
    np.testing.assert_array_equal(got, want)


def test_a_pad_with_a_vector_wide_row_is_cut_by_rows_and_exact():
    """Padding rows only (H), 64 columns: the rows outside the pad are their own parts."""
    target = host_target()
    rules = CpuRules(target)
    x = te.placeholder((1, 8, 30, 64), name="x")
    func = te.create_prim_func([x, topi.nn.pad(x, [0, 0, 2, 0], [0, 0, 2, 0])])
    scheduled, info = rules.schedule(func)
    assert info.parts == 3
    got, want = _run(func, scheduled, target, np.random.default_rng(2))
    np.testing.assert_array_equal(got, want)
