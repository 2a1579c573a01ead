"""The vector row-reduction rule: layer norm and softmax rows whole vectors long are summed in
vector partial sums and compute what the unscheduled kernel computes; other rows keep scalar sums,
computed once per row."""
from __future__ import annotations

import numpy as np
import pytest

from packager.optimize.schedule.rules.cpu import CpuRules
from support.kernel_cases import case, host_target, kernels_of, random_args, run_kernel, w


def _cases(width: int) -> dict:
    return {
        "layernorm": case("LayerNormalization", {"x": [1, 24, width]}, {"axis": -1}, {"g": w(width), "b": w(width)}),
        "softmax": case("Softmax", {"x": [2, 3, width]}, {"axis": -1}),
        "reduce_sum": case("ReduceSum", {"x": [5, width]}, {"keepdims": 1}, {"axes": np.array([1], np.int64)}),
    }


@pytest.mark.parametrize("name", ["layernorm", "softmax"])
@pytest.mark.parametrize("lanes_per_row", [2, 48])
def test_rows_of_whole_vectors_use_partial_sums_and_equal_unscheduled(name, lanes_per_row):
    target = host_target()
    rules = CpuRules(target)
    width = lanes_per_row * rules.lanes(32)
    for kname, func in kernels_of(_cases(width)[name]).items():
        scheduled, info = rules.schedule(func)
        assert info.rule == "vector-row-reduction", f"{kname}: {info}"
        assert info.parallel > 1 and info.vector == rules.lanes(32)
        args = random_args(func)
        ref = run_kernel(func, target, [a.copy() for a in args])
        got = run_kernel(scheduled, target, [a.copy() for a in args])
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=f"{name}/{kname}")


@pytest.mark.parametrize("shape", [[2, 3, 49], [1, 1004]])   # 1004: not whole 8- or 16-lane vectors
def test_rows_not_whole_vectors_keep_scalar_sums_once_per_row(shape):
    """dlight's rule, given a single row, computed the row's max and sum once per output element."""
    from tvm import s_tir

    target = host_target()
    rules = CpuRules(target)
    for func in kernels_of(case("Softmax", {"x": shape}, {"axis": -1})).values():
        scheduled, info = rules.schedule(func)
        assert info.rule == "vector-row-reduction" and "scalar" in info.note, info
        sch = s_tir.Schedule(scheduled)
        outer = [sch.get(lp).extent for lp in sch.get_loops(sch.get_sblock("T_softmax_maxelem"))]
        assert int(np.prod([int(e) for e in outer])) == int(np.prod(shape)), outer   # rows x row length, no more
        args = random_args(func)
        ref = run_kernel(func, target, [a.copy() for a in args])
        got = run_kernel(scheduled, target, [a.copy() for a in args])
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_a_reduction_without_an_element_wise_tail_is_not_taken():
    """A sum alone ends in a reduction: the tiled-reduction rule's kind of kernel, refused here."""
    from tvm import s_tir

    from packager.optimize.schedule.rules.reduce import vector_row_reduction
    from packager.optimize.schedule.tir_util import RuleMismatch

    rules = CpuRules(host_target())
    for func in kernels_of(_cases(64)["reduce_sum"]).values():
        sch = s_tir.Schedule(func)
        try:
            vector_row_reduction(rules, sch)
        except RuleMismatch:
            continue
        raise AssertionError("taken for a kernel without an element-wise block after its reduction")


def test_a_mean_across_a_packed_layout_is_not_taken_as_rows():
    """A mean over H and W of NCHW16c reduces across the innermost (channel) index: the row rule
    without partial sums gave wrong results for it (found by test_untimed_properties)."""
    from tvm import s_tir, te

    from packager.optimize.schedule.rules.reduce import vector_row_reduction
    from packager.optimize.schedule.tir_util import RuleMismatch

    x = te.placeholder((1, 1, 5, 5, 16), name="x")
    rh, rw = te.reduce_axis((0, 5)), te.reduce_axis((0, 5))
    total = te.compute((1, 1, 1, 1, 16), lambda n, c, h, w, ci: te.sum(x[n, c, rh, rw, ci], axis=[rh, rw]))
    mean = te.compute((1, 1, 1, 1, 16), lambda *i: total(*i) / 25.0)
    with pytest.raises(RuleMismatch):
        vector_row_reduction(CpuRules(host_target()), s_tir.Schedule(te.create_prim_func([x, mean])))
