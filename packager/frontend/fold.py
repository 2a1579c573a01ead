"""Static-shape folding before import, with onnxruntime's constant folding.

Exporters (PyTorch, Paddle, tf2onnx) write shape arithmetic into the graph: Shape -> Gather /
Slice -> Unsqueeze -> Concat -> Reshape, ConstantOfShape of a computed size, Range over a
computed length. Once the spec binds every input dim, all of it is constant, but TVM's importer
sees symbolic shape values and refuses many consumers ("Reshape requires the input new shape to
be Shape"). We let onnxruntime fold it: its ConstantFolding transformer evaluates every node whose
inputs are constants with ONNX Runtime's own kernels (so any op onnxruntime runs folds), replaces
Shape of a statically shaped tensor by its value, and repeats to a fixpoint, which the model's
shape inference then carries further. Why onnxruntime and not onnxsim/onnxslim: it is already a
dependency (verify and the wrapper model need it), it is the reference the package is checked
against, and it folds with the same kernels that define the expected results.

Only ConstantFolding runs: every other basic-level transformer (Conv+BN fusion, CSE, constant
sharing, MatMul+Add fusion, ...) is disabled, because the packager's own passes do those with an
on/off switch in the spec and a line in the build report. A transformer a newer onnxruntime adds
is caught by the guard below: folding may only remove nodes, never introduce an op type.

What onnxruntime cannot load (e.g. a custom domain it does not know) is left to our own rewrites
(`rewrites.py`: Shape of a static tensor and small constant computations, with ONNX's reference
evaluator), which also run after this on everything.
"""
from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass

import onnx

from .attrs import all_graphs
from .shapes import SMALL_CONSTANT, weights_as_inputs

# Every basic-level (level 1) graph transformer of onnxruntime 1.2x-1.3x except ConstantFolding.
OTHER_ORT_TRANSFORMERS = [
    "Level1_RuleBasedTransformer", "CommonSubexpressionElimination", "ConstantSharing", "MatMulAddFusion",
    "ReshapeFusion", "GeluFusionL1", "LayerNormFusionL1", "SliceConcatToSpaceToDepthFusion", "TransposeOptimizer",
    "QDQPropagationTransformer", "DoubleQDQPairsRemover", "EnsureUniqueDQForNodeUnit", "WeightBiasQuantization",
    "WhereDummyDq", "CastFloat16Transformer", "RemoveDuplicateCastTransformer", "FreeDimensionOverrideTransformer",
    "MatMulIntegerToFloatFusion", "DynamicQuantizeMatMulFusion", "QDQSelectorActionTransformer",
    "QDQFinalCleanupTransformer", "NhwcTransformer", "ConvActivationFusion", "GemmActivationFusion",
]


@dataclass(frozen=True)
class FoldResult:
    model: onnx.ModelProto
    removed: int                   # nodes replaced by constants
    note: str = ""                 # why onnxruntime did not fold, if it did not


def fold_constants(bound: onnx.ModelProto) -> FoldResult:
    """`bound` (every input dim static) with its constant computations folded by onnxruntime."""
    import onnxruntime as ort

    bound = _initializers_not_inputs(bound)
    bound, weights = _weights_as_inputs(bound)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="packager-fold-") as tmp:
        so.optimized_model_filepath = os.path.join(tmp, "folded.onnx")
        try:
            ort.InferenceSession(bound.SerializeToString(), so, providers=["CPUExecutionProvider"],
                                 disabled_optimizers=OTHER_ORT_TRANSFORMERS)
        except Exception as e:  # noqa: BLE001 - onnxruntime cannot load it: our own folding still runs
            why = f"onnxruntime could not load the model ({str(e).splitlines()[0][:160]})"
            return FoldResult(_restore_weights(bound, weights), 0, why)
        folded = onnx.load(so.optimized_model_filepath)
    _keep_domains(folded, bound)
    new_ops = {n.op_type for n in folded.graph.node} - {n.op_type for n in _all_nodes(bound)}
    if new_ops:
        return FoldResult(_restore_weights(bound, weights), 0,
                          f"skipped: onnxruntime's optimizer introduced {sorted(new_ops)}")
    return FoldResult(_restore_weights(folded, weights), len(bound.graph.node) - len(folded.graph.node))


def _weights_as_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[onnx.TensorProto]]:
    """The model with every large initializer that no folding can read turned into a graph input
    of its type and shape, and those initializers. onnxruntime copies each weight into the session
    and writes it out again with the optimized model: 8 of GPT-2's 28 s warm rebuild. A weight
    only read by nodes with some input that is not constant (a MatMul's activations) is never
    folded, so the folded graph is the same without its value; weights read by a node whose inputs
    may all be constant, or from a subgraph, keep their values."""
    g = model.graph
    constant = {t.name for t in g.initializer} | {""}
    for n in g.node:                   # ONNX nodes are in topological order
        if n.op_type in ("Shape", "Size") or all(i in constant for i in n.input):
            constant.update(n.output)  # Shape / Size: every dim is bound, so they fold
    foldable_reads = {i for n in g.node if all(i in constant for i in n.input) for i in n.input}
    subgraph_reads = {i for sub in all_graphs(g) if sub is not g for n in sub.node for i in n.input}
    keep = foldable_reads | subgraph_reads | {o.name for o in g.output}
    moved = [t for t in g.initializer if math.prod(t.dims) > SMALL_CONSTANT and t.name not in keep]
    if not moved:
        return model, []
    return weights_as_inputs(model, {t.name for t in moved}), moved


def _restore_weights(model: onnx.ModelProto, weights: list[onnx.TensorProto]) -> onnx.ModelProto:
    """`model` with the weights _weights_as_inputs moved back from graph inputs to initializers
    (those a node still reads)."""
    if not weights:
        return model
    names = {t.name for t in weights}
    read = {i for n in model.graph.node for i in n.input}
    inputs = [v for v in model.graph.input if v.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    model.graph.initializer.extend(t for t in weights if t.name in read)
    return model


def _initializers_not_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Old exporters (IR < 4) list every initializer as a graph input too; onnxruntime then treats
    them as overridable and folds nothing that reads a weight. Drop them from the inputs."""
    inits = {i.name for i in model.graph.initializer}
    if not any(v.name in inits for v in model.graph.input):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [v for v in out.graph.input if v.name not in inits]
    del out.graph.input[:]
    out.graph.input.extend(keep)
    out.ir_version = max(out.ir_version, 4)
    return out


def _keep_domains(folded: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """onnxruntime writes an opset import for every domain it knows; keep the original's."""
    del folded.opset_import[:]
    folded.opset_import.extend(original.opset_import)


def _all_nodes(model: onnx.ModelProto):
    """Nodes of the graph and of its subgraphs (If/Loop bodies)."""
    return (n for g in all_graphs(model.graph) for n in g.node)
