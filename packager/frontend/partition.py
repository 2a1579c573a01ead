"""Partial offload: split a model into parts the packager compiles and nodes ONNX Runtime runs.

A node stays in ONNX Runtime when the packager cannot compile it (operator not supported, custom
domain), when the spec says so (`onnxruntime.keep_ops` / `keep_nodes`), or when compiling it
would need a shape known only at run time (a shape operand computed from data, or an input whose
shape ONNX shape inference cannot make static for every profile). The remaining nodes are grouped
greedily, in topological order, into the largest connected parts whose contraction to one node
creates no cycle (no path leaves a part and comes back into it through a kept node).
"""
from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, field

import onnx
from onnx import helper

from . import resize
from .fold import fold_constants
from .opset import default_opset
from .model import (ONNX_DTYPES, STATIC_OPERANDS, SUPPORTED_OPS, LoadedModel, TensorInfo, runtime_values,
                    unsupported_configuration)
from .shapes import infer_shapes

TRIVIAL_OPS = {"Constant", "Identity", "Shape", "Size"}     # never worth a part on their own


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Every tensor a node reads: its inputs, and the outer-scope names its subgraphs (If/Loop/Scan
    bodies) use without defining; a part that feeds only a subgraph must still export the tensor."""
    reads = list(node.input)
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            defined = {v.name for v in sub.input} | {i.name for i in sub.initializer} | \
                      {o for n in sub.node for o in n.output}
            reads += [i for n in sub.node for i in node_reads(n) if i and i not in defined and i not in reads]
    return reads


@dataclass
class Part:
    name: str
    nodes: list[int]                  # indices into the source graph's node list (topological order)
    inputs: list[str]                 # tensors entering the part
    outputs: list[str]                # tensors leaving it


@dataclass
class Partition:
    parts: list[Part]
    kept: list[int]                                   # node indices left to ONNX Runtime
    reasons: dict[int, str] = field(default_factory=dict)

    @property
    def whole(self) -> bool:
        return not self.kept and len(self.parts) == 1


TensorTypes = dict[str, tuple[str, tuple]]            # tensor -> (dtype, shape with ints or None)


# ONNX Runtime's symbolic inference infers a subgraph again for each level that encloses it: its
# time doubles per nesting level (14 nested Ifs took 17 s, 25 did not finish). Deeper models keep
# ONNX's own inference.
MAX_NESTING = 6


def nesting(graph: onnx.GraphProto) -> int:
    """How deep If/Loop/Scan bodies nest below `graph` (0: no subgraph)."""
    subs = [g for n in graph.node for a in n.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]
    return 1 + max(nesting(g) for g in subs) if subs else 0


def _ort_shape_inference(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX Runtime's symbolic shape inference, which also knows its contrib ops (com.microsoft);
    the model unchanged if it cannot handle it or its subgraphs nest deeper than MAX_NESTING. It
    runs in a scratch folder: when it falls back to ONNX's inference it writes
    sym_shape_infer_temp.onnx (+ .data) into the working directory."""
    if default_opset(model) is None:         # it handles only models with default-domain nodes
        return model
    if nesting(model.graph) > MAX_NESTING:
        return model
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
        with tempfile.TemporaryDirectory(prefix="packager-shapes-") as tmp, contextlib.chdir(tmp):
            out = SymbolicShapeInference.infer_shapes(model, auto_merge=False, guess_output_rank=False)
        return out if out is not None else model
    except Exception:  # noqa: BLE001 - an op it does not know: keep ONNX's own inference
        return model


def tensor_types(model: LoadedModel, shapes: dict[str, tuple[int, ...]]) -> TensorTypes:
    """dtype and shape of every tensor after binding input shapes and running shape inference
    (ONNX's, then ONNX Runtime's for what ONNX's left unknown, e.g. contrib ops; each can lose
    what the other finds), and, for what both leave unknown, ONNX's again on the model with its
    shape arithmetic folded (Reshape targets computed from Shape, as Paddle exports). Unknown
    stays None: such tensors are never compiled."""
    onnx_inferred = infer_shapes(model, shapes, strict=False, keep_weights=False)
    out = _read_types(onnx_inferred.graph)
    _fill_gaps(out, _ort_shape_inference(onnx_inferred))
    if not all(_static(t) for t in out.values()):
        folded = fold_constants(onnx_inferred)
        if folded.removed:
            _fill_gaps(out, infer_shapes(model, shapes, strict=False, proto=folded.model, keep_weights=False))
    return out


def _fill_gaps(types: TensorTypes, inferred: onnx.ModelProto) -> None:
    for name, t in _read_types(inferred.graph).items():
        if not _static(types.get(name)):
            types[name] = t


def _read_types(g: onnx.GraphProto) -> TensorTypes:
    out: TensorTypes = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim) \
            if tt.HasField("shape") else None
        out[vi.name] = (ONNX_DTYPES.get(tt.elem_type, "unknown"), dims)
    for init in g.initializer:
        out[init.name] = (ONNX_DTYPES.get(init.data_type, "unknown"), tuple(init.dims))
    return out


def _static(t: tuple[str, tuple] | None) -> bool:
    return t is not None and t[0] != "unknown" and t[1] is not None and all(d is not None for d in t[1])


def _unsupported(node: onnx.NodeProto, graph: onnx.GraphProto, keep_ops: set[str], keep_nodes: set[str]) -> str | None:
    if node.domain not in ("", "ai.onnx"):
        return f"{'custom ' if node.domain != 'ai.onnx.ml' else ''}domain {node.domain}"
    if node.name and node.name in keep_nodes:
        return "listed in onnxruntime.keep_nodes"
    if node.op_type in keep_ops:
        return "listed in onnxruntime.keep_ops"
    if node.op_type not in SUPPORTED_OPS:
        return "operator not supported by the packager"
    return unsupported_configuration(node, graph)


def partition(model: LoadedModel, profile_types: list[TensorTypes], keep_ops=(), keep_nodes=()) -> Partition:
    graph = model.proto.graph
    nodes = list(graph.node)
    inits = {i.name for i in graph.initializer}
    reasons: dict[int, str] = {}
    for k, n in enumerate(nodes):
        why = _unsupported(n, graph, set(keep_ops), set(keep_nodes))
        if not why and n.op_type == "Resize":          # needs the input's type (profile_types)
            why = resize.unsupported(n, (profile_types[0].get(n.input[0]) or (None,))[0])
        if why:
            reasons[k] = why
    # Shape constraints, to a fixpoint: keeping one node in ORT can make a consumer's shape
    # operands run-time data.
    changed = True
    while changed:
        changed = False
        dynamic = runtime_values(nodes, {i.name for i in model.inputs}, set(reasons))
        for k, n in enumerate(nodes):
            if k in reasons:
                continue
            why = None
            for idx in STATIC_OPERANDS.get(n.op_type, ()):
                if idx < len(n.input) and n.input[idx] in dynamic:
                    why = f"shape operand '{n.input[idx]}' is only known at run time"
            for name in n.input:
                if name and name not in inits and not all(_static(t.get(name)) for t in profile_types):
                    why = f"input '{name}' has no static shape"
            for name in n.output:
                if name and not all(_static(t.get(name)) for t in profile_types):
                    why = f"output '{name}' has no static shape"
            if why:
                reasons[k] = why
                changed = True

    supported = [k for k in range(len(nodes)) if k not in reasons]
    if not reasons:        # everything compiles: one whole-model unit (however many components it has)
        return Partition([_boundary("p0", supported, nodes, inits, graph)], [], {})
    groups = _group(nodes, supported)
    parts, kept = [], sorted(reasons)
    for members in groups:
        if all(nodes[k].op_type in TRIVIAL_OPS for k in members):
            kept.extend(members)
            for k in members:
                reasons[k] = "trivial node left in ONNX Runtime"
            continue
        parts.append(members)
    kept.sort()
    out_parts = [_boundary(f"p{i}", m, nodes, inits, graph) for i, m in enumerate(sorted(parts, key=min))]
    return Partition(out_parts, kept, {k: reasons[k] for k in kept})


def _group(nodes: list[onnx.NodeProto], supported: list[int]) -> list[list[int]]:
    """Greedy convex grouping with ancestor/descendant bitsets (Python ints)."""
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    preds = [{producer[i] for i in node_reads(n) if i in producer} for n in nodes]
    anc = [0] * len(nodes)
    for k in range(len(nodes)):
        for p in preds[k]:
            anc[k] |= anc[p] | (1 << p)
    desc = [0] * len(nodes)
    for k in reversed(range(len(nodes))):
        for p in preds[k]:
            desc[p] |= desc[k] | (1 << k)
    group_of: dict[int, int] = {}
    groups: dict[int, int] = {}                        # group id -> member bitset

    def convex(members: int) -> bool:
        a = d = 0
        m = members
        while m:
            low = m & -m
            k = low.bit_length() - 1
            a |= anc[k]
            d |= desc[k]
            m ^= low
        return (a & d & ~members) == 0

    supported_set = set(supported)
    for k in supported:
        candidates = sorted({group_of[p] for p in preds[k] if p in supported_set},
                            key=lambda g: -bin(groups[g]).count("1"))
        merged = (1 << k)
        for g in candidates:
            merged |= groups[g]
        if candidates and convex(merged):
            gid = candidates[0]
            for g in candidates[1:]:
                for m in _members(groups.pop(g)):
                    group_of[m] = gid
            groups[gid] = merged
            group_of[k] = gid
            continue
        for g in candidates:
            if convex(groups[g] | (1 << k)):
                groups[g] |= 1 << k
                group_of[k] = g
                break
        else:
            group_of[k] = k
            groups[k] = 1 << k
    return [sorted(_members(b)) for b in groups.values()]


def _members(bits: int) -> list[int]:
    out = []
    while bits:
        low = bits & -bits
        out.append(low.bit_length() - 1)
        bits ^= low
    return out


def _boundary(name: str, members: list[int], nodes, inits: set[str], graph) -> Part:
    inside = set(members)
    produced = {o for k in members for o in nodes[k].output if o}
    constant_out = {o for n in nodes if n.op_type == "Constant" for o in n.output}
    inputs: list[str] = []
    for k in members:
        for i in nodes[k].input:
            if i and i not in produced and i not in inits and i not in constant_out and i not in inputs:
                inputs.append(i)
    graph_outputs = {o.name for o in graph.output}
    consumed_outside = {i for k, n in enumerate(nodes) if k not in inside for i in node_reads(n)}
    outputs = [o for k in members for o in nodes[k].output if o and (o in consumed_outside or o in graph_outputs)]
    return Part(name, members, inputs, outputs)


def _value_info(name: str, types: list[TensorTypes]) -> onnx.ValueInfoProto:
    """A value_info whose dims are fixed where every profile agrees, symbolic where they differ."""
    dtype = types[0][name][0]
    shapes = [t[name][1] for t in types]
    dims = [shapes[0][a] if all(s[a] == shapes[0][a] for s in shapes) else f"{name}_d{a}"
            for a in range(len(shapes[0]))]
    elem = {v: k for k, v in ONNX_DTYPES.items()}[dtype]
    return helper.make_tensor_value_info(name, elem, dims)


def part_model(model: LoadedModel, part: Part, types: list[TensorTypes]) -> onnx.ModelProto:
    """The part as a standalone ONNX model (Constant producers it reads are copied in)."""
    graph = model.proto.graph
    nodes = list(graph.node)
    needed = {i for k in part.nodes for i in nodes[k].input}
    consts = [n for k, n in enumerate(nodes) if n.op_type == "Constant" and k not in part.nodes
              and any(o in needed for o in n.output)]
    body = consts + [nodes[k] for k in part.nodes]
    used = {i for n in body for i in n.input}
    inits = [i for i in graph.initializer if i.name in used]
    g = helper.make_graph(body, f"{graph.name or 'model'}_{part.name}",
                          [_value_info(i, types) for i in part.inputs],
                          [_value_info(o, types) for o in part.outputs], inits)
    m = helper.make_model(g, opset_imports=list(model.proto.opset_import), producer_name="packager")
    m.ir_version = model.proto.ir_version
    return m


def part_loaded(model: LoadedModel, part: Part, types: list[TensorTypes]) -> LoadedModel:
    proto = part_model(model, part, types)

    def info(vi):
        tt = vi.type.tensor_type
        return TensorInfo(vi.name, ONNX_DTYPES[tt.elem_type],
                          tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in tt.shape.dim))
    return LoadedModel(model.path, proto, model.opset, [info(v) for v in proto.graph.input],
                       [info(v) for v in proto.graph.output], label=f"{model.path.name} [part {part.name}]")


def boundary_value_info(names: list[str], types: list[TensorTypes]) -> list[onnx.ValueInfoProto]:
    return [_value_info(n, types) for n in names]
