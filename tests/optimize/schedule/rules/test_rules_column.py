"""The column-reduction rule: a softmax over an axis that is not the innermost (YOLOv8's
distribution head) reduces with the innermost axis as vector lanes, computes what the
unscheduled kernel computes, and leaves last-axis softmax to the row rules."""
from __future__ import annotations

import numpy as np
import pytest

from packager.optimize.schedule.rules.cpu import CpuRules
from support.kernel_cases import case, host_target, kernels_of, random_args, run_kernel


@pytest.mark.parametrize("shape,axis", [([1, 16, 4, 240], 1), ([2, 5, 3, 32], 1), ([2, 3, 7, 48], 2)])
def test_softmax_over_an_outer_axis_reduces_in_vector_columns(shape, axis):
    target = host_target()
    rules = CpuRules(target)
    for func in kernels_of(case("Softmax", {"x": shape}, {"axis": axis})).values():
        scheduled, info = rules.schedule(func)
        assert info.rule == "column-reduction" and f"over axis {axis}" in info.note, info
        assert info.vector >= 4 and info.parallel == int(np.prod(shape)) // shape[axis] // info.vector
        args = random_args(func)
        ref = run_kernel(func, target, [a.copy() for a in args])
        got = run_kernel(scheduled, target, [a.copy() for a in args])
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


def test_a_last_axis_softmax_is_left_to_the_row_rules():
    rules = CpuRules(host_target())
    for func in kernels_of(case("Softmax", {"x": [4, 64]}, {"axis": -1})).values():
        assert rules.schedule(func)[1].rule == "vector-row-reduction"
