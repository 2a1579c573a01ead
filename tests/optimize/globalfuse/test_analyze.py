"""The tensor-expression analysis (analyze.py): Souffle's classification of each kernel."""
from __future__ import annotations

from packager.optimize.globalfuse.analyze import te_summary
from packager.optimize.globalfuse.graph import kernel_graph
from support.globalfuse_cases import optimized


def test_analysis_classifies_tensor_expressions(transformer):
    alone, _ = optimized(transformer, global_fusion=False)
    s = te_summary(kernel_graph(alone))
    assert s.tes == s.one_to_one + s.one_to_many
    assert s.one_to_many >= 6            # 6 matmuls + softmax and layer norm reductions
    assert 1 <= s.compute_intensive <= s.one_to_many
    assert s.layout_only >= 4
