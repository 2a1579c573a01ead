"""Outlining (outline.py): a group of calls becomes one merged kernel that computes what the
calls computed, and a value still read outside its group is never dropped."""
from __future__ import annotations

import numpy as np
import pytest

from packager.errors import InternalError
from packager.optimize.globalfuse.graph import kernel_graph
from packager.optimize.globalfuse.outline import Group, merged_kernels, outline
from support.kernel_cases import host_target, optimized_module, scores_attention


def _three_kernels():
    model = scores_attention(16, 16, 8)
    mod = optimized_module(model, host_target(), global_fusion=False)
    return mod, kernel_graph(mod), model


def test_a_group_becomes_one_kernel_that_computes_the_same():
    import tvm
    from tvm import relax

    mod, g, model = _three_kernels()
    _, softmax, pv = sorted(g.calls)
    grp = Group("softmax_pv", (softmax, pv), (pv,), pv)
    out = outline(mod, g, [grp])
    assert len(kernel_graph(out).calls) == 2
    (merged,) = merged_kernels(out, g, [grp])
    assert merged is not None
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype("float32")
             for i in model.graph.input]
    runs = []
    for m in (mod, out):
        vm = relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())
        runs.append(vm["main"](*[tvm.runtime.tensor(f) for f in feeds]).numpy())
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-5, atol=1e-6)


def test_a_member_read_outside_its_group_is_refused():
    mod, g, _ = _three_kernels()
    scores, softmax, _ = sorted(g.calls)
    with pytest.raises(InternalError, match="still read outside its group"):   # P @ V reads the softmax
        outline(mod, g, [Group("bad", (scores, softmax), (scores,), scores)])
