"""ONNX -> ONNX rewrites, applied just before TVM's importer, that keep a valid model's meaning
while avoiding constructs the importer rejects or gets wrong:

* `Pow` with operands of different types (or integer operands): computed in floating point.
* `ReduceMax`/`ReduceMin` on bool: computed on uint8.
* `ReduceMax`/`ReduceMin` over an empty axis: ONNX says -inf/+inf; the output becomes a constant.
* `Split` with zero-sized pieces: the empty outputs become constants, the rest is split normally.
* `Trilu` of an empty tensor: Identity.
* `Mod` with fmod=0 on floats (Python-style sign): fmod plus the sign fix, so infinities behave.
* `LayerNormalization` that also returns Mean/InvStdDev: written out in primitive operators (the
  importer implements only the normalized output).
* `Shape`/`Size` of a tensor with a static shape: a constant (shapes are static per profile; the
  importer's symbolic shape values are refused by many consumers).
* `LSTM`, `GRU`, `RNN`: a projection and a loop kernel per direction (recurrent.py; these, Resize,
  CumSum/TopK and the QLinear ops are registered from lowering.py).
* `Resize`: gathers and weighted sums per resized axis, weights from onnxruntime (resize.py).
* `CumSum`, `TopK`: a triangular MatMul and rounds of ArgMax (selection.py).
* `Reshape` with allowzero=1 and no 0 in its shape: the flag dropped (it only matters for 0s).
* `Dropout` (inference): Identity, and a constant all-true mask where the mask is read.
* 1-D `Conv` with a constant weight (with `conv1d_as_2d`, the simplify pass's switch): a 2-D Conv
  over a height of 1 between Unsqueeze and Squeeze.
* `QLinearMatMul`, `QLinearConv`, `ConvInteger`: MatMulInteger / shifted float Conv + requantize
  (quantized.py).
* Constant folding of small computations on constants (shape arithmetic such as
  Shape -> Gather -> Concat -> Reshape), with ONNX's reference evaluator, and `Constant` nodes
  in any of their attribute forms become initializers.

Each rewrite needs the static shapes and types of one profile (the model after shape inference).
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import UserError
from .attrs import attr, constant, initializer
from .lowering import LOWERINGS
from .recurrent import DOMAIN as OUR_DOMAIN

FLOATS = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16}


class _Types:
    """Element type and static shape of every tensor of an inferred model."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.elem: dict[str, int] = {}
        self.shape: dict[str, tuple | None] = {}
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            if vi.type.HasField("tensor_type"):
                tt = vi.type.tensor_type
                self.elem[vi.name] = tt.elem_type
                self.shape[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                            for d in tt.shape.dim) if tt.HasField("shape") else None
        for init in g.initializer:
            self.elem[init.name] = init.data_type
            self.shape[init.name] = tuple(init.dims)


class _Builder:
    """Adds fresh tensor names and initializers to a graph being rewritten."""

    def __init__(self, graph: onnx.GraphProto, opset: int):
        self.graph = graph
        self.opset = opset
        self.names = {o for n in graph.node for o in n.output} | {i.name for i in graph.input} | \
            {i.name for i in graph.initializer}
        self.count = 0

    def fresh(self, hint: str) -> str:
        while True:
            self.count += 1
            name = f"{hint}__rw{self.count}"
            if name not in self.names:
                self.names.add(name)
                return name

    def const(self, hint: str, value: np.ndarray) -> str:
        name = self.fresh(hint)
        self.graph.initializer.append(numpy_helper.from_array(value, name))
        return name


def _reduced_axes(node, t: _Types, graph: onnx.GraphProto) -> list[int] | None:
    rank = len(t.shape.get(node.input[0]) or ())
    axes = attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        value = initializer(graph, node.input[1])
        if value is None:
            return None                               # axes computed at run time: leave it to the importer
        axes = value.tolist()
    if axes is None:
        return [] if attr(node, "noop_with_empty_axes", 0) else list(range(rank))
    return [a % rank for a in axes]


def _shape_or_size(node, t: _Types, b: _Builder):
    ins, outs = list(node.input), list(node.output)
    if t.shape.get(ins[0]) is None or None in t.shape[ins[0]]:
        return None
    dims = list(t.shape[ins[0]])
    if node.op_type == "Size":
        value = np.array(int(np.prod(dims, dtype=np.int64)), np.int64)
    else:
        value = np.array(dims[slice(attr(node, "start", 0), attr(node, "end", len(dims)))], np.int64)
    return [helper.make_node("Identity", [b.const(outs[0], value)], outs)]


def _pow(node, t: _Types, b: _Builder):
    ins, outs = list(node.input), list(node.output)
    base, exp = t.elem.get(ins[0]), t.elem.get(ins[1])
    if base is None or exp is None or (base == exp and base in FLOATS):
        return None
    if base in FLOATS:
        e = b.fresh(ins[1])
        return [helper.make_node("Cast", [ins[1]], [e], to=base), helper.make_node("Pow", [ins[0], e], outs)]
    a, e, r = b.fresh(ins[0]), b.fresh(ins[1]), b.fresh(outs[0])
    return [helper.make_node("Cast", [ins[0]], [a], to=TensorProto.DOUBLE),
            helper.make_node("Cast", [ins[1]], [e], to=TensorProto.DOUBLE),
            helper.make_node("Pow", [a, e], [r]), helper.make_node("Cast", [r], outs, to=base)]


def _reduce_min_max(node, t: _Types, b: _Builder):
    op, ins, outs = node.op_type, list(node.input), list(node.output)
    shape, out_shape = t.shape.get(ins[0]), t.shape.get(outs[0])
    axes = _reduced_axes(node, t, b.graph)
    if shape and axes and out_shape is not None and None not in out_shape and any(shape[a] == 0 for a in axes):
        dtype = helper.tensor_dtype_to_np_dtype(t.elem[ins[0]])
        if dtype == np.bool_:
            value = op == "ReduceMin"                      # identity of any() / all()
        elif np.issubdtype(dtype, np.floating):
            value = -np.inf if op == "ReduceMax" else np.inf
        else:
            value = np.iinfo(dtype).min if op == "ReduceMax" else np.iinfo(dtype).max
        return [helper.make_node("Identity", [b.const(outs[0], np.full(out_shape, value, dtype))], outs)]
    if t.elem.get(ins[0]) == TensorProto.BOOL:
        x, r = b.fresh(ins[0]), b.fresh(outs[0])
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return [helper.make_node("Cast", [ins[0]], [x], to=TensorProto.UINT8),
                helper.make_node(op, [x, *ins[1:]], [r], **attrs),
                helper.make_node("Cast", [r], outs, to=TensorProto.BOOL)]
    return None


def _split(node, t: _Types, b: _Builder):
    ins, outs = list(node.input), list(node.output)
    sizes = initializer(b.graph, ins[1]) if len(ins) > 1 and ins[1] else None
    if sizes is None or not (sizes == 0).any():
        return None
    dtype = helper.tensor_dtype_to_np_dtype(t.elem[ins[0]])
    keep = [(s, o) for s, o in zip(sizes.tolist(), outs) if s]
    new = []
    for s, o in zip(sizes.tolist(), outs):
        if not s:
            shape = t.shape.get(o)
            if shape is None or None in shape:
                return None
            new.append(helper.make_node("Identity", [b.const(o, np.zeros(shape, dtype))], [o]))
    if len(keep) == 1:
        new.append(helper.make_node("Identity", [ins[0]], [keep[0][1]]))
    elif keep:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        sz = b.const(ins[1], np.array([s for s, _ in keep], np.int64))
        new.append(helper.make_node("Split", [ins[0], sz], [o for _, o in keep], **attrs))
    return new


def _trilu(node, t: _Types, b: _Builder):
    shape = t.shape.get(node.input[0])
    return [helper.make_node("Identity", [node.input[0]], list(node.output))] if shape and 0 in shape else None


def _mod(node, t: _Types, b: _Builder):
    ins, outs = list(node.input), list(node.output)
    if attr(node, "fmod", 0) or t.elem.get(ins[0]) not in FLOATS:
        return None
    z = b.const("zero", np.array(0, helper.tensor_dtype_to_np_dtype(t.elem[ins[0]])))
    r, is_zero, r_neg, y_neg, differ, nonzero, fix, shifted = (b.fresh(outs[0]) for _ in range(8))
    return [helper.make_node("Mod", ins, [r], fmod=1),               # C fmod: sign of x
            helper.make_node("Equal", [r, z], [is_zero]),
            helper.make_node("Less", [r, z], [r_neg]), helper.make_node("Less", [ins[1], z], [y_neg]),
            helper.make_node("Xor", [r_neg, y_neg], [differ]), helper.make_node("Not", [is_zero], [nonzero]),
            helper.make_node("And", [differ, nonzero], [fix]),
            helper.make_node("Add", [r, ins[1]], [shifted]),
            helper.make_node("Where", [fix, shifted, r], outs)]       # Python mod: sign of y


def _layernorm(node, t: _Types, b: _Builder):
    if not any(node.output[1:]) or t.shape.get(node.input[0]) is None:
        return None
    return _layernorm_with_stats(node, t, b)


def _reshape_allowzero(node, t: _Types, b: _Builder):
    """allowzero=1 (torch's dynamo exporter writes it on every Reshape) only matters for a 0 in the
    shape operand: without one, the same Reshape without the flag (TVM's importer ignores it)."""
    shape = constant(b.graph, node.input[1]) if attr(node, "allowzero", 0) else None
    if shape is None:
        return None
    if (shape == 0).any():
        raise UserError(f"node {node.name or '?'} (Reshape): allowzero=1 with a 0 in its shape (an empty tensor); "
                        "keep it in ONNX Runtime (onnxruntime.keep_nodes)")
    return [helper.make_node("Reshape", list(node.input), list(node.output), name=node.name)]


def _clip_defaults(node, t: _Types, b: _Builder):
    """Clip without min or max clamps to the type's lowest / max (ONNX's defaults: +-inf become
    +-FLT_MAX, as in onnxruntime), which TVM's importer drops; written as Max/Min with the bounds,
    which keep a NaN (optimize/ieee.py)."""
    elem = t.elem.get(node.input[0])
    dtype = helper.tensor_dtype_to_np_dtype(elem) if elem else None
    ins = list(node.input) + [""] * (3 - len(node.input))
    if dtype is None or dtype.kind != "f" or ins[1] or ins[2]:
        return None
    info = np.finfo(dtype)
    low = b.fresh(f"{node.name or 'clip'}_low")
    return [helper.make_node("Max", [ins[0], b.const("lowest", np.array(info.min, dtype))], [low]),
            helper.make_node("Min", [low, b.const("highest", np.array(info.max, dtype))], list(node.output),
                             name=node.name)]


def _dropout(node, t: _Types, b: _Builder):
    """Inference-time Dropout (no training_mode input; model.py refuses one) is the identity and an
    all-true mask. TVM's importer keeps it as an op whose kernel writes the mask too, which fused
    it into the matmul before it as a second output (no tiled schedule: AlexNet's 151 MB FC layer
    ran at a third of the memory bandwidth)."""
    outs = list(node.output) + [""]
    new = [helper.make_node("Identity", [node.input[0]], [outs[0]], name=node.name)]
    if outs[1]:
        shape = t.shape.get(node.input[0])
        if shape is None or None in shape:
            return None
        dtype = helper.tensor_dtype_to_np_dtype(t.elem.get(outs[1], TensorProto.BOOL))   # T before opset 10
        new.append(helper.make_node("Identity", [b.const(outs[1], np.ones(shape, dtype))], [outs[1]]))
    return new


def _conv1d(node, t: _Types, b: _Builder):
    """A 1-D Conv as a 2-D one over a height of 1 (what onnxruntime does too): the conv2d layouts
    and schedules (channel blocks, register tiles) then apply; TVM's conv1d kernel vectorized
    along the output length (5 frames in openWakeWord's STFT conv: 3x onnxruntime's time)."""
    ins, outs = list(node.input), list(node.output)
    shape = t.shape.get(ins[0])
    if shape is None or len(shape) != 3 or len(outs) != 1 or len(ins) < 2:
        return None
    weight = initializer(b.graph, ins[1])
    if weight is None or weight.ndim != 3:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    pads = attrs.get("pads", [0, 0])
    attrs2 = {"group": attrs.get("group", 1), "kernel_shape": [1, weight.shape[2]],
              "strides": [1, *attrs.get("strides", [1])], "dilations": [1, *attrs.get("dilations", [1])]}
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        attrs2["auto_pad"] = attrs["auto_pad"]
    else:
        attrs2["pads"] = [0, pads[0], 0, pads[1]]
    x4, y4 = b.fresh(ins[0]), b.fresh(outs[0])
    axis = b.const("axis2", np.array([2], np.int64))
    unsqueeze = (helper.make_node("Unsqueeze", [ins[0], axis], [x4]) if b.opset >= 13 else
                 helper.make_node("Unsqueeze", [ins[0]], [x4], axes=[2]))
    squeeze = (helper.make_node("Squeeze", [y4, axis], outs) if b.opset >= 13 else
               helper.make_node("Squeeze", [y4], outs, axes=[2]))
    w4 = b.const(ins[1], weight[:, :, None, :])
    return [unsqueeze, helper.make_node("Conv", [x4, w4, *ins[2:]], [y4], name=node.name, **attrs2), squeeze]


REWRITES = {"Clip": _clip_defaults, "Shape": _shape_or_size, "Size": _shape_or_size, "Pow": _pow,
            "ReduceMax": _reduce_min_max, "ReduceMin": _reduce_min_max, "Split": _split, "Trilu": _trilu, "Mod": _mod,
            "LayerNormalization": _layernorm, "Reshape": _reshape_allowzero, "Dropout": _dropout, **LOWERINGS}


def _layernorm_with_stats(node, t: _Types, b: _Builder) -> list[onnx.NodeProto]:
    ins, outs = list(node.input), list(node.output) + ["", ""]
    rank = len(t.shape[ins[0]])
    axes = list(range(attr(node, "axis", -1) % rank, rank))
    dtype = helper.tensor_dtype_to_np_dtype(t.elem[ins[0]])
    eps = b.const("eps", np.array(attr(node, "epsilon", 1e-5), dtype))
    mean, d, d2, var, ve, std, inv, norm = (outs[1] or b.fresh("ln_mean"), *(b.fresh("ln") for _ in range(6)),
                                            b.fresh("ln_norm"))
    inv = outs[2] or inv

    def reduce_mean(x: str, y: str) -> onnx.NodeProto:
        if b.opset >= 18:
            return helper.make_node("ReduceMean", [x, b.const("axes", np.array(axes, np.int64))], [y], keepdims=1)
        return helper.make_node("ReduceMean", [x], [y], axes=axes, keepdims=1)

    nodes = [reduce_mean(ins[0], mean), helper.make_node("Sub", [ins[0], mean], [d]),
             helper.make_node("Mul", [d, d], [d2]), reduce_mean(d2, var), helper.make_node("Add", [var, eps], [ve]),
             helper.make_node("Sqrt", [ve], [std]), helper.make_node("Reciprocal", [std], [inv]),
             helper.make_node("Mul", [d, inv], [norm])]
    if len(ins) > 2 and ins[2]:
        scaled = b.fresh("ln_scaled")
        return nodes + [helper.make_node("Mul", [norm, ins[1]], [scaled]),
                        helper.make_node("Add", [scaled, ins[2]], [outs[0]])]
    return nodes + [helper.make_node("Mul", [norm, ins[1]], [outs[0]])]


FOLD_MAX_ELEMENTS = 1 << 16          # larger results stay computed by kernels (no weight blow-up)
NEVER_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
              "Bernoulli", "Dropout"}
# A DequantizeLinear of an 8-bit constant stays a node: the int8 pass (optimize/int8.py) reads a QDQ
# weight's values, scale and zero point from it, and `simplify` folds what that pass leaves.
QDQ_WEIGHT_TYPES = (TensorProto.INT8, TensorProto.UINT8)


def _qdq_weight(node: onnx.NodeProto, known: dict[str, onnx.TensorProto]) -> bool:
    return node.op_type == "DequantizeLinear" and known[node.input[0]].data_type in QDQ_WEIGHT_TYPES


def _fold(model: onnx.ModelProto) -> int:
    """Evaluate nodes whose inputs are all constants; their outputs become initializers."""
    g = model.graph
    known = {i.name: i for i in g.initializer}
    graph_outputs = {o.name for o in g.output}
    opsets = list(model.opset_import)
    kept, folded = [], 0
    for node in g.node:
        ins = [i for i in node.input if i]
        if (node.domain not in ("", "ai.onnx") or node.op_type in NEVER_FOLD or not all(i in known for i in ins)
                or any(o in graph_outputs for o in node.output) or _qdq_weight(node, known)):
            kept.append(node)
            continue
        try:
            values = _evaluate(node, [known[i] for i in ins], opsets)
        except Exception:  # noqa: BLE001 - the reference evaluator lacks some ops: keep the node
            kept.append(node)
            continue
        if sum(v.size for v in values) > FOLD_MAX_ELEMENTS:
            kept.append(node)
            continue
        for name, value in zip(node.output, values):
            if name:
                known[name] = numpy_helper.from_array(np.asarray(value), name)
                g.initializer.append(known[name])
        folded += 1
    del g.node[:]
    g.node.extend(kept)
    return folded


def _evaluate(node: onnx.NodeProto, inputs: list[onnx.TensorProto], opsets) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator   # imported only when there is something to fold

    graph = helper.make_graph([node], "fold", [], [helper.make_empty_tensor_value_info(o) for o in node.output if o],
                              inputs)
    return ReferenceEvaluator(helper.make_model(graph, opset_imports=opsets)).run(None, {})


def rewrite(model: onnx.ModelProto, conv1d_as_2d: bool = False,
            counts: Counter | None = None) -> tuple[onnx.ModelProto, int]:
    """The model (after shape inference) with the rewrites applied; returns it and how many nodes
    were replaced or folded (`counts`, if given, gets the replaced nodes per op type)."""
    t = _Types(model)
    b = _Builder(model.graph, next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17))
    table = {**REWRITES, **({"Conv": _conv1d} if conv1d_as_2d else {})}
    nodes, changed = [], 0
    for node in model.graph.node:
        fn = table.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        new = fn(node, t, b) if fn else None
        if new is None:
            nodes.append(node)
            continue
        nodes.extend(new)
        changed += 1
        if counts is not None:
            counts[node.op_type] += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    if any(n.domain == OUR_DOMAIN for n in nodes) and OUR_DOMAIN not in {o.domain for o in model.opset_import}:
        model.opset_import.append(helper.make_opsetid(OUR_DOMAIN, 1))
    return model, changed + _fold(model)
