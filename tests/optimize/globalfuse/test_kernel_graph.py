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


def test_a_recurrent_loop_kernel_is_not_a_call_global_fusion_may_take():
    """Its time loop is written as plain loops, not blocks: fusing it would fail in TVM."""
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np
    from packager.optimize.schedule.rules.recurrence import cell_of

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
               for n, s in (("W", (1, 24, 4)), ("R", (1, 24, 8)), ("B", (1, 48)))]
    nodes = [helper.make_node("GRU", ["x", "W", "R", "B"], ["seq"], hidden_size=8),
             helper.make_node("Relu", ["seq"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 1, 1, 8])], weights),
        opset_imports=[helper.make_opsetid("", 17)])
    mod = optimized_module(model, host_target())                     # global fusion on
    loops = [gv for gv, f in mod.functions.items() if hasattr(f, "attrs") and f.attrs and cell_of(f)]
    assert len(loops) == 1
    g = kernel_graph(mod)
    assert loops[0] not in [c.func for c in g.calls.values()]
