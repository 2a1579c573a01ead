"""Reading ONNX node attributes and constant operands (shared by the checks, rewrites and lowerings)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def all_graphs(graph: onnx.GraphProto):
    """`graph` and every subgraph (If/Loop/Scan bodies) below it."""
    stack = [graph]
    while stack:
        g = stack.pop()
        yield g
        for n in g.node:
            for a in n.attribute:
                stack.extend(([a.g] if a.HasField("g") else []) + list(a.graphs))


def attr(node: onnx.NodeProto, name: str, default=None):
    """The value of attribute `name` of `node`, or `default` when it is not set."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def initializer(graph: onnx.GraphProto, name: str) -> np.ndarray | None:
    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    return None


def constant(graph: onnx.GraphProto, name: str) -> np.ndarray | None:
    """An initializer's or a Constant node's value (tensor or list forms), None if computed."""
    value = initializer(graph, name)
    if value is not None:
        return value
    for n in graph.node:
        if n.op_type == "Constant" and n.output[0] == name and len(n.attribute) == 1:
            a = n.attribute[0]
            v = helper.get_attribute_value(a)
            return numpy_helper.to_array(v) if a.name == "value" else np.asarray(v)
    return None
