"""Layout chains (chains.py): a chain of copies stores each copy once."""
from __future__ import annotations

from packager.optimize.globalfuse.graph import kernel_graph
from packager.optimize.globalfuse.vertical import layout_kernels
from support.globalfuse_cases import optimized, report_of


def test_cpu_layout_chains_store_each_copy_once(transformer):
    """The head split and the copies of its outputs (Q's and V's reshapes, K's transposes)
    become one layout kernel; nothing else reads the values in between."""
    fused, reports = optimized(transformer)
    chains = report_of(reports, "global_fusion").details["layout_chains"]
    assert chains["taken"] == 1 and chains["absorbed"] == 3, chains
    g = kernel_graph(fused)
    layout = layout_kernels(g)
    assert len(layout) == 2                                       # the merged split, the heads' merge
    for i in layout:                                              # no copy of a copy is left
        assert not any(j in layout for j in g.call_inputs(i)), g.calls[i].name
