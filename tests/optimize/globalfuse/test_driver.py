"""The global_fusion pass as a whole (driver.py): what it merges per target kind, and a merged module
computes what FuseOps alone computes."""
from __future__ import annotations

import numpy as np
import pytest

from packager.optimize.globalfuse import combine_siblings
from packager.optimize.globalfuse.graph import kernel_graph
from packager.optimize.globalfuse.vertical import layout_kernels
from packager.optimize.pipeline import PassContext
from packager.optimize.simplify import simplify
from packager.spec import OptimizeSpec
from support.globalfuse_cases import optimized, report_of, run_module


def test_layout_copies_fold_and_qkv_combine_on_a_gpu_target(transformer, h100):
    fused, reports = optimized(transformer, h100)
    alone, alone_reports = optimized(transformer, h100, global_fusion=False)
    gf = report_of(reports, "global_fusion")
    assert gf.status == "applied"
    assert report_of(alone_reports, "global_fusion").status == "disabled"
    n_alone = len(kernel_graph(alone).calls)
    n_fused = len(kernel_graph(fused).calls)
    assert n_alone == 15 and n_fused <= 0.6 * n_alone, gf.summary
    assert gf.details["kernels_after"] == n_fused
    assert gf.details["horizontal"] == {"groups": 1, "matmuls": 3, "conv_groups_left": 0}
    assert layout_kernels(kernel_graph(fused)) == set()            # no copy kernel left
    assert gf.details["dram_bytes_after"] < gf.details["dram_bytes_before"]
    assert "sibling matmuls combined: 3 -> 1" in gf.summary
    assert "CPU targets only" in gf.summary                       # row regions: CPU only


def test_cpu_target_takes_row_regions_and_no_unmeasured_folds(transformer):
    fused, reports = optimized(transformer)                       # x86-64, measuring off
    gf = report_of(reports, "global_fusion")
    assert gf.details["row_regions"]["taken"] == 1                 # softmax into P @ V
    assert gf.details["row_regions"]["with_matmul"] == 1           # and the scores Q @ K^T before it
    assert gf.details["layout_folded"] == 0 and "not tried" in gf.details["layout_note"]
    assert "not measured" in gf.summary


def test_cpu_folds_only_what_is_not_measured_slower(transformer, tmp_path):
    """Every merged kernel taken was measured faster than its parts or tied with them within the
    timer's resolution (times are reported rounded to 0.1 us)."""
    from packager.optimize.globalfuse.timing import pays

    _, reports = optimized(transformer, measure=True, database=tmp_path)
    d = report_of(reports, "global_fusion").details
    for m in d["measured"] + d["row_regions"]["measured"]:
        assert pays(m["fused_us"] - 0.05, m["separate_us"] + 0.05), m
    for why in list(d["refused"].values()) + list(d["row_regions"]["refused"].values()):
        assert "slower when measured" in why or "when fused" in why or "row-region" in why, why


@pytest.mark.parametrize("where", ["x86-64", "h100"])
def test_fused_module_computes_the_same(transformer, h100, where):
    """The merged graph (unscheduled kernels, run on this CPU) against FuseOps alone: on h100
    the copies fold, Q/K/V combine and chains become phased kernels, on x86-64 the softmax joins
    P @ V."""
    x = np.random.default_rng(1).standard_normal((1, 32, 64)).astype(np.float32)
    target = h100 if where == "h100" else None
    fused, _ = optimized(transformer, target)
    alone, _ = optimized(transformer, target, global_fusion=False)
    np.testing.assert_allclose(run_module(fused, x), run_module(alone, x), rtol=1e-5, atol=1e-5)


def test_the_input_module_is_left_alone(transformer):
    """Targets and profiles share one imported module: the pass must not change it."""
    spec, mod, target = transformer
    simple, _ = simplify(mod)
    before = simple.script()
    combine_siblings(simple, PassContext(None, OptimizeSpec(level=2)))
    assert simple.script() == before
    alone, _ = optimized(transformer, global_fusion=False)
    before = alone.script()
    from packager.optimize.globalfuse import global_fusion
    global_fusion(alone, PassContext(target, OptimizeSpec(level=2, measure=False)))
    assert alone.script() == before
