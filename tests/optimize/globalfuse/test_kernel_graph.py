"""The kernel graph (graph.py): main's call_tir bindings as nodes, with who produces and who reads
each value, the plan every global-fusion step works on."""
from __future__ import annotations

from packager.optimize.globalfuse.graph import kernel_graph
from support.kernel_cases import host_target, optimized_module, scores_attention


def test_calls_producers_and_readers_follow_the_data_flow():
    mod = optimized_module(scores_attention(16, 16, 8), host_target(), global_fusion=False)
    g = kernel_graph(mod)
    order = sorted(g.calls)
    assert len(order) == 3                                 # scores, softmax, P @ V
    scores, softmax, pv = order
    assert g.consumers[scores] == [softmax] and g.consumers[softmax] == [pv]
    assert g.call_inputs(pv) == [softmax] and g.call_inputs(scores) == []   # reads graph inputs only
    assert g.returned == {pv} and g.producer[g.calls[softmax].var] == softmax
    assert all(g.calls[i].prim is not None and g.calls[i].name for i in order)
