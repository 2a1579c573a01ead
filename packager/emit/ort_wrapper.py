"""ort/model.onnx: a model ONNX Runtime loads, where compiled parts are `ai.packager.PackagedModel`
nodes run by the package's custom-op library and everything else stays an ordinary ONNX node.

Users then need only: `so.register_custom_ops_library(<pkg>/ort/<arch>/libpackager_ort.so)` and
`InferenceSession("<pkg>/ort/model.onnx", so)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx
from onnx import helper

from ..frontend.partition import Partition, boundary_value_info, node_reads

if TYPE_CHECKING:
    from .assemble import CompiledUnit

DOMAIN, OP = "ai.packager", "PackagedModel"
MAX_IR_VERSION = 10          # every onnxruntime release we support reads IR 10 (ORT 1.31 reads <= 13)


@dataclass(frozen=True)
class PackagedNode:
    """One compiled part: its package folder relative to ort/, identity, the sha256 of its
    manifest.json (the custom op opens only that build), and boundary tensors."""

    name: str
    package: str
    package_id: str
    package_sha256: str
    inputs: list[str]
    outputs: list[str]

    def node(self) -> onnx.NodeProto:
        return helper.make_node(OP, self.inputs, self.outputs, name=self.name, domain=DOMAIN,
                                package=self.package, package_id=self.package_id,
                                package_sha256=self.package_sha256)


def wrapper_model(source: onnx.ModelProto, parts: list[PackagedNode], kept_nodes: list[onnx.NodeProto],
                  value_info: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    """The source model's inputs/outputs around `parts` (packaged) and `kept_nodes` (run by ORT).

    Nodes are re-sorted topologically; initializers are kept only where ORT nodes (or their subgraphs) read them;
    value_info declares every tensor a PackagedModel node produces, since ONNX Runtime cannot
    infer the types of a custom op's outputs."""
    g = source.graph
    nodes = _toposort([p.node() for p in parts] + list(kept_nodes), {i.name for i in g.input} |
                      {i.name for i in g.initializer})
    used = {name for n in kept_nodes for name in node_reads(n)}
    inits = [i for i in g.initializer if i.name in used]
    init_names = {i.name for i in g.initializer}
    inputs = [i for i in g.input if i.name not in init_names]
    graph = helper.make_graph(nodes, f"{g.name or 'model'}_packaged", inputs, list(g.output), inits,
                              value_info=value_info)
    opsets = [o for o in source.opset_import if o.domain != DOMAIN] + [helper.make_opsetid(DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="packager")
    model.ir_version = min(source.ir_version, MAX_IR_VERSION)
    return model


def _toposort(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Kahn's algorithm, keeping the given order among nodes that are ready together."""
    ready = set(available) | {""}
    out, pending = [], list(range(len(nodes)))
    while pending:
        progress = [k for k in pending if all(i in ready for i in node_reads(nodes[k]))]
        if not progress:
            names = ", ".join(nodes[k].name or nodes[k].op_type for k in pending[:5])
            raise ValueError(f"cannot order nodes (cycle or missing input): {names}")
        for k in progress:
            out.append(nodes[k])
            ready.update(nodes[k].output)
        done = set(progress)
        pending = [k for k in pending if k not in done]
    return out


def wrapper_for(model, units: list[CompiledUnit], split: Partition | None, ids: dict[str, str], pins: dict[str, str],
                types) -> onnx.ModelProto:
    """The whole model as one PackagedModel node, or the kept nodes plus one node per compiled part.
    `ids` and `pins` (manifest sha256) are per unit name."""
    nodes = list(model.proto.graph.node)
    if split is None:
        u = units[0]
        part = PackagedNode(model.path.stem, "..", ids[u.name], pins[u.name], [i.name for i in model.inputs],
                            [o.name for o in model.outputs])
        return wrapper_model(model.proto, [part], [], [])
    parts = [PackagedNode(f"packaged_{p.name}", f"../parts/{p.name}", ids[u.name], pins[u.name], p.inputs, p.outputs)
             for p, u in zip(split.parts, units)]
    produced = [o for p in split.parts for o in p.outputs]
    graph_outputs = {o.name for o in model.proto.graph.output}
    return wrapper_model(model.proto, parts, [nodes[k] for k in split.kept],
                         boundary_value_info([o for o in produced if o not in graph_outputs], types))
