"""Reading ONNX node attributes (shared by the rewrites and the recurrent unrolling)."""
from __future__ import annotations

import onnx
from onnx import helper


def attr(node: onnx.NodeProto, name: str, default=None):
    """The value of attribute `name` of `node`, or `default` when it is not set."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default
