"""Horizontal fusion (horizontal.py): sibling matmuls reading one input combine into one matmul
on the concatenated weight; sibling convs are reported as left apart."""
from __future__ import annotations

import numpy as np
from tvm import relax

from packager.frontend import import_relax
from packager.optimize.globalfuse import combine_siblings
from packager.optimize.pipeline import PassContext
from packager.optimize.simplify import simplify
from packager.spec import OptimizeSpec
from support.globalfuse_cases import run_module


def _weights_read_by_matmuls_of_tokens(mod) -> list[np.ndarray]:
    return [b.value.args[1].value.numpy() for b in mod["main"].body.blocks[0].bindings
            if getattr(getattr(b.value, "op", None), "name", "") == "relax.matmul" and b.value.args[0].name == "tokens"]


def test_combined_weight_is_the_concatenation(transformer):
    spec, mod, _ = transformer
    simple, _ = simplify(mod)
    originals = _weights_read_by_matmuls_of_tokens(simple)
    ctx = PassContext(None, OptimizeSpec(level=2))
    combined, _ = combine_siblings(simple, ctx)
    weights = _weights_read_by_matmuls_of_tokens(combined)
    assert len(originals) == 3 and len(weights) == 1
    np.testing.assert_array_equal(weights[0], np.concatenate(originals, axis=1))
    assert ctx.notes["horizontal"] == {"groups": 1, "matmuls": 3, "conv_groups_left": 0}


def test_two_heads_without_bias_combine_and_compute_the_same():
    """LeViT's two classifier heads (dynamo export: bias-free Gemms on one pooled tensor, summed)
    made the combiner fail on a rebuilt call whose type was never populated."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 384), "float32"))
    w1, w2 = (relax.const(rng.standard_normal((384, 100)).astype(np.float32)) for _ in range(2))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, w1))
            b = bb.emit(relax.op.matmul(x, w2))
            out = bb.emit_output(relax.op.add(a, b))
        bb.emit_func_output(out)
    mod = bb.get()
    ctx = PassContext(None, OptimizeSpec(level=2))
    combined, _ = combine_siblings(mod, ctx)
    assert ctx.notes["horizontal"]["groups"] == 1
    feed = rng.standard_normal((1, 384)).astype(np.float32)
    np.testing.assert_allclose(run_module(combined, feed), run_module(mod, feed), rtol=1e-5, atol=1e-4)


def test_sibling_convs_are_reported_as_left_apart():
    """Two 1x1 convs reading one tensor (Inception branches): not combined (TVM 0.27 has no
    CombineParallelConv2D), and the report says so."""
    from onnx import helper

    from packager.frontend import LoadedModel, TensorInfo
    from support.kernel_cases import case, w

    m = case("Conv", {"x": [1, 8, 6, 6]}, {}, {"w1": w(4, 8, 1, 1)})
    m.graph.node.extend([helper.make_node("Conv", ["x", "w2"], ["y2"]), helper.make_node("Add", ["y", "y2"], ["z"])])
    m.graph.initializer.append(helper.make_tensor("w2", 1, [4, 8, 1, 1], w(4, 8, 1, 1).ravel().tolist()))
    m.graph.output[0].name = "z"
    inputs = [TensorInfo("x", "float32", (1, 8, 6, 6))]
    mod, _ = import_relax(LoadedModel(None, m, 17, inputs, [TensorInfo("z", "float32", ())]),
                          {"x": (1, 8, 6, 6)}, {"x": "float32"})
    ctx = PassContext(None, OptimizeSpec(level=2))
    combine_siblings(simplify(mod)[0], ctx)
    assert ctx.notes["horizontal"]["conv_groups_left"] == 1
