"""If and Loop that the spec's profiles make static, taken out of the graph before partition.

Exporters write control flow that depends only on shapes: `if x.shape[0] == 1`, a loop over a
fixed number of heads or layers. Once the spec binds every input dim such a condition or trip
count is a constant, and the node can be replaced by plain operators that compile:

* If whose condition has one value under every profile: the chosen branch's nodes are inlined in
  its place (its tensors keep their names where they are free).
* Loop with a trip count that is the same under every profile, no initial condition or a constant
  true one, and a body that passes its condition through unchanged (a `for`, not a `while`): the
  body is unrolled LOOP_MAX_UNROLL times at most; loop-carried values are threaded through the
  copies and scan outputs are stacked with Unsqueeze + Concat.

A condition or trip count is evaluated by onnxruntime on the nodes that compute it, fed zeros of
each profile's input shapes, and only when nothing it reads depends on input values (Shape/Size
see only shapes). Whatever cannot be taken out stays in ONNX Runtime (partial offload) with the
reason in the build log; the ONNX node tests of If/Loop feed their conditions as inputs, so they
are rated unsupported by conformance, as they should be.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .attrs import attr, constant
from .model import LoadedModel, runtime_values
from .shapes import bind_dims

CONTROL_FLOW = ("If", "Loop")
LOOP_MAX_UNROLL = 64            # iterations; longer loops stay in ONNX Runtime
LOOP_MAX_NODES = 20000          # nodes an unrolled loop may add
MAX_ROUNDS = 8                  # inlining a branch can expose nested control flow


@dataclass
class ControlFlowResult:
    proto: onnx.ModelProto
    inlined: dict[str, int] = field(default_factory=dict)      # "If" / "Loop" -> how many were taken out
    kept: dict[str, str] = field(default_factory=dict)         # "name (op)" -> why it stays in ONNX Runtime

    def summary(self) -> str:
        said = [f"inlined If x{self.inlined['If']}" if self.inlined.get("If") else "",
                f"unrolled Loop x{self.inlined['Loop']}" if self.inlined.get("Loop") else ""]
        return ", ".join(s for s in said if s)


def without_static_control_flow(model: LoadedModel, profiles: list[dict[str, tuple[int, ...]]]) -> LoadedModel:
    """The model with its static If/Loop taken out (unchanged when it has none); what was done and
    what stays is in `.control_flow`."""
    flow = inline_control_flow(model, profiles)
    if not flow.inlined and not flow.kept:
        return model
    return replace(model, proto=flow.proto, control_flow=flow)


def inline_control_flow(model: LoadedModel, profiles: list[dict[str, tuple[int, ...]]]) -> ControlFlowResult:
    """`model.proto` with every If/Loop that is static under all `profiles` replaced by plain nodes."""
    result = ControlFlowResult(model.proto)
    if not any(n.op_type in CONTROL_FLOW for n in model.proto.graph.node):
        return result
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    inputs = {i.name: i for i in model.inputs}
    for _ in range(MAX_ROUNDS):
        values, result.kept = _static_operands(proto, inputs, profiles)
        if not values:
            break
        _replace(proto, values, result)
    if result.inlined:
        _drop_dead(proto.graph)
    result.proto = proto
    return result


def label(node: onnx.NodeProto) -> str:
    """How the log and the report name an If/Loop: 'loop0 (Loop)' (its first output if unnamed)."""
    return f"{node.name or node.output[0]} ({node.op_type})"


def _static_operands(proto, inputs, profiles) -> tuple[dict[int, list], dict[str, str]]:
    """Node index -> the value of its condition (If) or [trip count, initial condition] (Loop)
    when static and equal under every profile; and why each other If/Loop is not."""
    g = proto.graph
    opaque = {k for k, n in enumerate(g.node) if n.op_type in CONTROL_FLOW}
    dynamic = runtime_values(g.node, set(inputs), opaque)
    behind = _downstream(g, opaque)
    wanted: dict[int, list[str]] = {}
    kept: dict[str, str] = {}
    for k, node in enumerate(g.node):
        if node.op_type not in CONTROL_FLOW or node.domain not in ("", "ai.onnx"):
            continue
        operands = [node.input[0]] if node.op_type == "If" else [node.input[0], node.input[1]]
        why = _loop_shape(node) if node.op_type == "Loop" else None
        what = "condition" if node.op_type == "If" else "trip count"
        from_data = [o for o in operands if o and o in dynamic]
        from_flow = [o for o in operands if o and o in behind]
        why = why or (f"its {what} '{from_flow[0]}' depends on another If/Loop's result (even only on its shape)"
                      if from_flow else f"its {what} '{from_data[0]}' is computed from input data" if from_data else None)
        if why:
            kept[label(node)] = why
        else:
            wanted[k] = operands
    if not wanted:
        return {}, kept
    names = sorted({o for ops in wanted.values() for o in ops if o})
    per_profile = [_evaluate(proto, names, inputs, shapes) for shapes in profiles]
    values: dict[int, list] = {}
    for k, operands in wanted.items():
        node = g.node[k]
        seen = [[None if not o else p[o].item() for o in operands] for p in per_profile]
        why = None
        if any(s != seen[0] for s in seen):
            why = "its condition or trip count differs between profiles"
        elif node.op_type == "Loop":
            why = _loop_count(node, *seen[0])
        if why:
            kept[label(node)] = why
        else:
            values[k] = seen[0]
    return values, kept


def _downstream(g: onnx.GraphProto, sources: set[int]) -> set[str]:
    """Every tensor computed from the outputs of nodes `sources`, through any op (Shape too: the
    shape of an If's result can depend on the branch it takes)."""
    from .partition import node_reads

    reached: set[str] = set()
    for k, node in enumerate(g.node):
        if k in sources or any(i in reached for i in node_reads(node)):
            reached.update(o for o in node.output if o)
    return reached


def _loop_shape(node: onnx.NodeProto) -> str | None:
    """Why a Loop is not a `for` loop that unrolls, from its form alone."""
    body = attr(node, "body")
    if not node.input[0]:
        return "it has no trip count (a while loop)"
    cond_in, cond_out = body.input[1].name, body.output[0].name
    passes = cond_out == cond_in or any(n.op_type == "Identity" and n.output[0] == cond_out and
                                        n.input[0] == cond_in for n in body.node)
    const = constant(body, cond_out)
    if not passes and not (const is not None and bool(np.all(const))):
        return "its body computes the loop condition (a while loop)"
    if any(a.HasField("g") or len(a.graphs) for n in body.node for a in n.attribute):
        return "its body holds nested control flow"
    if body.sparse_initializer:
        return "its body has sparse initializers"
    return None


def _loop_count(node: onnx.NodeProto, trips, cond) -> str | None:
    body = attr(node, "body")
    if cond is not None and not cond:
        return "its initial condition is false"
    if trips <= 0:
        return "it runs zero times"
    if trips > LOOP_MAX_UNROLL or trips * len(body.node) > LOOP_MAX_NODES:
        return f"{trips} iterations of {len(body.node)} nodes (unrolled: <= {LOOP_MAX_UNROLL} iterations, " \
               f"<= {LOOP_MAX_NODES} nodes)"
    return None


def _evaluate(proto, names: list[str], inputs, shapes) -> dict[str, np.ndarray]:
    """The values of `names` (shape-only computations) with the inputs bound to `shapes`: the nodes
    that compute them run in onnxruntime on zeros."""
    import onnxruntime as ort

    from .partition import node_reads

    g = proto.graph
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer if i.name in names}
    need, nodes = set(names) - set(consts), []
    for node in reversed(g.node):
        if need & set(node.output):
            nodes.append(node)
            need |= {i for i in node_reads(node) if i}
    if not set(names) - set(consts):
        return consts
    sub = onnx.ModelProto()
    sub.CopyFrom(bind_dims(proto, shapes))
    del sub.graph.node[:], sub.graph.output[:]
    sub.graph.node.extend(reversed(nodes))
    sub.graph.output.extend(helper.make_tensor_value_info(n, _elem(n, g), None) for n in names if n not in consts)
    feeds = {v.name: np.zeros(shapes[v.name], helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))
             for v in sub.graph.input if v.name in inputs}
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(sub.SerializeToString(), so, providers=["CPUExecutionProvider"])
    used = {i.name for i in sess.get_inputs()}
    out = sess.run(None, {k: v for k, v in feeds.items() if k in used})
    consts.update(zip([n for n in names if n not in consts], out))
    return consts


def _elem(name: str, g: onnx.GraphProto) -> int:
    """A condition is bool, a trip count int64 (ONNX fixes both)."""
    for n in g.node:
        if n.op_type == "If" and n.input[0] == name or n.op_type == "Loop" and len(n.input) > 1 and n.input[1] == name:
            return TensorProto.BOOL
    return TensorProto.INT64


def _replace(proto: onnx.ModelProto, values: dict[int, list], result: ControlFlowResult) -> None:
    g = proto.graph
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 21)
    nodes: list[onnx.NodeProto] = []
    added: set[str] = set()
    for k, node in enumerate(g.node):
        if k not in values:
            nodes.append(node)
            continue
        taken = _all_names(g, skip=k) | added            # the node's own subgraphs go away with it
        prefix = node.name or f"{node.op_type.lower()}{k}"
        if node.op_type == "If":
            branch = attr(node, "then_branch" if values[k][0] else "else_branch")
            nodes += _inline(branch, {}, list(node.output), g, taken, lambda n: f"{prefix}/{n}")[0]
        else:
            nodes += _unroll(node, int(values[k][0]), g, taken, prefix, opset)
        added |= taken
        result.inlined[node.op_type] = result.inlined.get(node.op_type, 0) + 1
    del g.node[:]
    g.node.extend(nodes)


def _drop_dead(g: onnx.GraphProto) -> None:
    """Nodes nothing reads any more (a body's pass-through condition, a branch's unused values)."""
    from .partition import node_reads

    live, kept = {o.name for o in g.output}, []
    for node in reversed(g.node):
        if any(o in live for o in node.output if o):
            kept.append(node)
            live.update(node_reads(node))
    del g.node[:]
    g.node.extend(reversed(kept))
    unused = [i for i in g.initializer if i.name not in live and i.name not in {v.name for v in g.input}]
    for init in unused:
        g.initializer.remove(init)


def _all_names(g: onnx.GraphProto, skip: int | None = None) -> set[str]:
    """Every name `g` and its subgraphs define (but not the subgraphs of node `skip`)."""
    names = {v.name for v in g.input} | {i.name for i in g.initializer} | {o for n in g.node for o in n.output}
    for k, n in enumerate(g.node):
        for a in (n.attribute if k != skip else ()):
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                names |= _all_names(sub)
    return names


def _inline(sub: onnx.GraphProto, bound: dict[str, str], outputs: list[str], g: onnx.GraphProto,
            taken: set[str], rename) -> tuple[list[onnx.NodeProto], dict[str, str]]:
    """`sub`'s nodes for the outer graph `g`, and where each of its names went: its inputs read
    `bound`, the names it defines are made unique (kept where free), its initializers move to `g`,
    and its outputs are written to `outputs` (an empty name: wherever they were defined)."""
    mapping = dict(bound)

    def define(name: str) -> str:
        new = name if name not in taken else rename(name)
        while new in taken:
            new += "_"
        taken.add(new)
        mapping[name] = new
        return new

    for init in sub.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = define(init.name)
        g.initializer.append(copy)
    produced = {o: i for i, o in enumerate(o.name for o in sub.output)}
    out_nodes = []
    for n in sub.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        del copy.input[:], copy.output[:]
        copy.input.extend(mapping.get(i, i) for i in n.input)
        for o in n.output:
            if o in produced and outputs[produced[o]] and o not in mapping:
                mapping[o] = outputs[produced[o]]       # write the branch output straight into the If's
            copy.output.append(mapping[o] if o in mapping else define(o) if o else "")
        _rename_reads(copy, mapping)
        copy.name = rename(n.name) if n.name else ""
        out_nodes.append(copy)
    for o, target in zip((o.name for o in sub.output), outputs):
        if mapping.get(o, o) != target and target:      # an outer name, an input or an initializer
            out_nodes.append(helper.make_node("Identity", [mapping.get(o, o)], [target], name=f"{target}/identity"))
    return out_nodes, mapping


def _rename_reads(node: onnx.NodeProto, mapping: dict[str, str]) -> None:
    """Nested subgraphs (an If inside an inlined branch) read renamed outer tensors too."""
    for a in node.attribute:
        for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for n in sub.node:
                n.input[:] = [mapping.get(i, i) for i in n.input]
                _rename_reads(n, mapping)


def _unroll(node: onnx.NodeProto, trips: int, g: onnx.GraphProto, taken: set[str], prefix: str,
            opset: int) -> list[onnx.NodeProto]:
    body = attr(node, "body")
    n_carried = len(node.input) - 2
    carried = list(node.input[2:])
    scans: list[list[str]] = [[] for _ in range(len(body.output) - 1 - n_carried)]
    out = []
    true = _const(g, taken, f"{prefix}/true", np.array(True))
    for it in range(trips):
        iter_shape = _declared_shape(body.input[0])
        bound = {body.input[0].name: _const(g, taken, f"{prefix}/iter{it}", np.array(it, np.int64).reshape(iter_shape)),
                 body.input[1].name: true}
        bound.update({v.name: c for v, c in zip(body.input[2:], carried)})
        names = [""] * len(body.output)                  # body outputs get fresh names per iteration
        step, mapping = _inline(body, bound, names, g, taken, lambda n, it=it: f"{prefix}/it{it}/{n}")
        out += step
        carried = [mapping.get(v.name, v.name) for v in body.output[1:1 + n_carried]]
        for s, v in zip(scans, body.output[1 + n_carried:]):
            s.append(mapping.get(v.name, v.name))
    for final, name in zip(carried, node.output[:n_carried]):
        if name:
            out.append(helper.make_node("Identity", [final], [name], name=f"{prefix}/{name}/final"))
    axes = _const(g, taken, f"{prefix}/axes0", np.array([0], np.int64)) if opset >= 13 else None
    for values, name in zip(scans, node.output[n_carried:]):
        if not name:
            continue
        stacked = []
        for v in values:
            s = _fresh(taken, f"{v}/stacked")
            out.append(helper.make_node("Unsqueeze", [v, axes], [s]) if axes else
                       helper.make_node("Unsqueeze", [v], [s], axes=[0]))
            stacked.append(s)
        out.append(helper.make_node("Concat", stacked, [name], axis=0, name=f"{prefix}/{name}/concat"))
    return out


def _declared_shape(v: onnx.ValueInfoProto) -> tuple[int, ...]:
    tt = v.type.tensor_type
    return tuple(d.dim_value or 1 for d in tt.shape.dim) if tt.HasField("shape") else ()


def _fresh(taken: set[str], name: str) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _const(g: onnx.GraphProto, taken: set[str], name: str, value: np.ndarray) -> str:
    name = _fresh(taken, name)
    g.initializer.append(numpy_helper.from_array(value, name))
    return name
