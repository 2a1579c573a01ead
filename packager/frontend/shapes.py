"""Bind the spec's input dims into the ONNX graph and infer every tensor's shape.

ONNX's shape inference takes a ModelProto and serializes it to C++ and back: with the weights in
it, BERT-base's 440 MB were copied four times per call, 1.4 s of every warm rebuild's 21 s each
time. Inference needs no weight values (only small constants, for shape arithmetic through
data_prop), so it runs on a copy whose large initializers are graph inputs of the same type and
shape, and the types it finds are copied back into the bound model.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import onnx
from onnx import helper

from ..errors import UserError
from .model import first_line

if TYPE_CHECKING:
    from .model import LoadedModel

SMALL_CONSTANT = 1024          # initializers up to this many elements keep their values (shape data flow)


def bind_dims(proto: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of `proto` whose inputs have the given static dims."""
    bound = onnx.ModelProto()
    bound.CopyFrom(proto)
    for v in bound.graph.input:
        if v.name in shapes:
            dims = v.type.tensor_type.shape.dim
            for d, size in zip(dims, shapes[v.name]):
                d.Clear()
                d.dim_value = size
    return bound


def infer_shapes(model: LoadedModel, shapes: dict[str, tuple[int, ...]], strict: bool = True,
                 proto: onnx.ModelProto | None = None, keep_weights: bool = True) -> onnx.ModelProto:
    """Bind the input dims of `proto` (default: the model's) and run ONNX shape inference, naming
    the node on failure. Not strict: ops without inference (custom domains) leave their outputs
    unknown instead of failing. Without `keep_weights` the result has its large initializers as
    graph inputs (for callers that only read types: no copy of the weights is made)."""
    source = model.proto if proto is None else proto
    light = without_large_constants(source)
    try:
        inferred = onnx.shape_inference.infer_shapes(bind_dims(light, shapes), strict_mode=strict, data_prop=True)
    except Exception as e:
        # A declared shape that ONNX's own inference disputes (it has known gaps, e.g. ceil-mode
        # pooling) is not fatal: TVM infers shapes again on import. Anything else is.
        if strict and "existing shape differ" in str(e):
            return infer_shapes(model, shapes, strict=False, proto=proto, keep_weights=keep_weights)
        raise UserError(f"{model}: shape inference failed with inputs {shapes}: {first_line(e)}") from None
    if not keep_weights or light is source:
        return inferred
    bound = bind_dims(source, shapes)
    _copy_types(bound.graph, inferred.graph, top=True)
    return bound


def without_large_constants(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every large initializer turned into a graph input of the same type and shape
    (`proto` itself when it has none)."""
    large = {t.name for t in proto.graph.initializer if math.prod(t.dims) > SMALL_CONSTANT}
    return weights_as_inputs(proto, large) if large else proto


def weights_as_inputs(proto: onnx.ModelProto, names: set[str]) -> onnx.ModelProto:
    """A copy of the model whose initializers `names` are graph inputs of their type and shape,
    made without copying those initializers (every other field is copied)."""
    light = onnx.ModelProto()
    for fd, value in proto.ListFields():
        if fd.name != "graph":
            _set_field(light, fd, value)
    for fd, value in proto.graph.ListFields():
        if fd.name == "initializer":
            light.graph.initializer.extend(t for t in value if t.name not in names)
        else:
            _set_field(light.graph, fd, value)
    inputs = {v.name for v in proto.graph.input}
    light.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in proto.graph.initializer if t.name in names and t.name not in inputs)
    return light


def _set_field(msg, fd, value) -> None:
    """Copy one protobuf field's value (repeated, message or scalar) into `msg`."""
    if fd.is_repeated:
        getattr(msg, fd.name).extend(value)
    elif fd.type == fd.TYPE_MESSAGE:
        getattr(msg, fd.name).CopyFrom(value)
    else:
        setattr(msg, fd.name, value)


def _copy_types(dst: onnx.GraphProto, src: onnx.GraphProto, top: bool) -> None:
    """Copy what inference wrote into `src` (value_info, output types, and inside If/Loop/Scan
    bodies also input types) into `dst`, the same graph with its weights. The top graph's inputs
    stay: `src` lists the weights there, and the bound inputs are already `dst`'s."""
    fields = ("value_info", "output") if top else ("value_info", "output", "input")
    for name in fields:
        target = getattr(dst, name)
        del target[:]
        target.extend(getattr(src, name))
    for dn, sn in zip(dst.node, src.node, strict=True):
        for da, sa in zip(dn.attribute, sn.attribute, strict=True):
            if da.type == onnx.AttributeProto.GRAPH:
                _copy_types(da.g, sa.g, top=False)
            elif da.type == onnx.AttributeProto.GRAPHS:
                for dg, sg in zip(da.graphs, sa.graphs, strict=True):
                    _copy_types(dg, sg, top=False)
