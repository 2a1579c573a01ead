"""The row-region rule: softmax merged into the attention matmul P @ V computes what the
unscheduled kernel computes, runs parallel + vectorized, and is not taken for kernels that are
not a matmul over per-row reductions (layer norm, softmax alone)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from packager.optimize.globalfuse.graph import kernel_graph
from packager.optimize.globalfuse.outline import Group, merged_kernels, outline
from packager.optimize.schedule.rules.cpu import CpuRules
from packager.optimize.schedule.tir_util import RuleMismatch
from support.kernel_cases import (CASES, case, host_target, kernels_of, optimized_module, random_args,
                                  run_kernel, scores_attention, w)


def _attention(rows: int, n: int, d: int):
    """softmax(S) @ V with S and V inputs: FuseOps keeps the softmax and the matmul apart."""
    softmax = helper.make_node("Softmax", ["s"], ["p"], axis=-1)
    matmul = helper.make_node("MatMul", ["p", "v"], ["y"])
    m = case("Identity", {"s": [1, 2, rows, n], "v": [1, 2, n, d]})
    m.graph.node.pop()
    m.graph.node.extend([softmax, matmul])
    return m


def _layernorm_matmul(k: int, n: int):
    """LayerNormalization -> MatMul with a constant [k, n] weight (a pre-LN projection)."""
    ln = helper.make_node("LayerNormalization", ["x", "g", "b"], ["h"], axis=-1)
    matmul = helper.make_node("MatMul", ["h", "w"], ["y"])
    m = case("Identity", {"x": [1, 64, k]}, inits={"g": w(k), "b": w(k), "w": w(k, n)})
    m.graph.node.pop()
    m.graph.node.extend([ln, matmul])
    return m


def _merged(model):
    """The model's last two kernels (a reduction, the matmul reading it) merged into one."""
    mod = optimized_module(model, global_fusion=False)
    g = kernel_graph(mod)
    r, c = sorted(g.calls)[-2:]
    grp = Group("attn", (r, c), (c,), c)
    return merged_kernels(outline(mod, g, [grp]), g, [grp])[0]


@pytest.mark.parametrize("rows,n,d", [(32, 32, 16), (20, 37, 24), (37, 29, 16)])
def test_softmax_into_matmul_equals_unscheduled(rows, n, d):
    target = host_target()
    func = _merged(_attention(rows, n, d))
    scheduled, info = CpuRules(target).schedule(func)
    assert info.rule == "row-region", info
    assert info.parallel > 1 and info.vector > 1
    args = random_args(func)
    ref = run_kernel(func, target, [a.copy() for a in args])
    got = run_kernel(scheduled, target, [a.copy() for a in args])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["layernorm", "softmax_last", "matmul_batched_big"])
def test_not_taken_without_a_matmul_over_row_reductions(name):
    from tvm import s_tir

    target = host_target()
    rules = CpuRules(target)
    for func in kernels_of(CASES[name]).values():
        with pytest.raises(RuleMismatch):
            rules.row_region(s_tir.Schedule(func))
        assert rules.schedule(func)[1].rule != "row-region"


def test_layer_norm_into_a_matmul_whose_weights_fit_the_cache():
    target = host_target()
    func = _merged(_layernorm_matmul(64, 64))                    # 16 KB of weights
    scheduled, info = CpuRules(target).schedule(func)
    assert info.rule == "row-region", info
    args = random_args(func)
    np.testing.assert_allclose(run_kernel(scheduled, target, [a.copy() for a in args]),
                               run_kernel(func, target, [a.copy() for a in args]), rtol=1e-5, atol=1e-5)


def test_refused_when_the_column_operand_would_be_reread_per_row_tile():
    from tvm import s_tir

    target = host_target()
    func = _merged(_layernorm_matmul(768, 2304))                 # GPT-2's QKV weights: 7 MB
    with pytest.raises(RuleMismatch, match="does not fit half the L2"):
        CpuRules(target).row_region(s_tir.Schedule(func))
    assert CpuRules(target).schedule(func)[1].rule != "row-region"


def _merged_whole(model):
    """Every kernel of the model merged into one, the last one the anchor."""
    mod = optimized_module(model, global_fusion=False)
    g = kernel_graph(mod)
    calls = sorted(g.calls)
    assert len(calls) == 3, [g.calls[c].name for c in calls]
    grp = Group("attn", tuple(calls), (calls[-1],), calls[-1])
    return merged_kernels(outline(mod, g, [grp]), g, [grp])[0]


@pytest.mark.parametrize("rows,n,d", [(32, 64, 16), (37, 29, 16), (64, 128, 64)])
def test_whole_attention_in_one_region_equals_unscheduled(rows, n, d):
    """The scores matmul joins the region too, register-tiled like the anchor (its reduction
    outside a tile of rows x column vectors: both matmuls decomposed into init + update); the
    softmax's max and sum as vector partial sums (two more init + update pairs) where the rows
    are whole vectors long."""
    target = host_target()
    func = _merged_whole(scores_attention(rows, n, d))
    scheduled, info = CpuRules(target).schedule(func)
    assert info.rule == "row-region", info
    if n % 16 == 0:
        text = scheduled.script()
        assert text.count('_update"') == 4 and text.count('_rf_update"') == 2, text
        assert "row sum(s) in vector partial sums" in info.note
    args = random_args(func)
    np.testing.assert_allclose(run_kernel(scheduled, target, [a.copy() for a in args]),
                               run_kernel(func, target, [a.copy() for a in args]), rtol=1e-5, atol=1e-5)
