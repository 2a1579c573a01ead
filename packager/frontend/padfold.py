"""Zero padding folded into the convolution that reads it (the `simplify` pass's ONNX step).

TensorFlow, Keras and Hugging Face ports of TF models write "SAME" padding as an explicit Pad
before a Conv (asymmetric for stride 2). TVM's importer turns the Pad into a kernel of its own,
FuseOps then makes it the epilogue of the previous conv, and that conv, its output now a padded
copy, loses its packed layout and its schedule: Hugging Face's MobileNetV2 ran its first 1x1 conv
5.2x slower than onnxruntime (2.2 vs 0.42 ms), the model 2.5x. onnxruntime folds such pads into
the Conv (its PadFusion); so does this, with the same conditions: constant mode, value 0, nothing
padded on the batch or channel axis, and every reader a Conv without auto_pad. The result is the
same arithmetic (the conv reads the same zeros from its own padding).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .attrs import attr, constant


def fold_pads_into_convs(model: onnx.ModelProto, opset: int) -> int:
    """Fold every eligible Pad of the top graph into the Convs reading it; returns how many."""
    g = model.graph
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in g.output}
    folded = []
    for pad in g.node:
        if pad.op_type != "Pad" or pad.domain not in ("", "ai.onnx") or pad.output[0] in outputs:
            continue
        amounts = _zero_pad_amounts(pad, g, opset)
        convs = readers.get(pad.output[0], [])
        if amounts is None or not convs or not all(_takes(c, pad.output[0], len(amounts) // 2) for c in convs):
            continue
        rank = len(amounts) // 2
        begin, end = amounts[2:rank], amounts[rank + 2:]
        for c in convs:
            old = attr(c, "pads", [0] * (2 * (rank - 2)))
            new = [int(p) + int(q) for p, q in zip(old, list(begin) + list(end))]
            del c.input[0]
            c.input.insert(0, pad.input[0])
            for a in list(c.attribute):
                if a.name in ("pads", "auto_pad"):
                    c.attribute.remove(a)
            c.attribute.append(helper.make_attribute("pads", new))
        folded.append(pad)
    for pad in folded:
        g.node.remove(pad)
    return len(folded)


def _zero_pad_amounts(pad: onnx.NodeProto, g: onnx.GraphProto, opset: int) -> list[int] | None:
    """[begin per axis..., end per axis...] of a constant-mode, zero-valued Pad whose batch and
    channel axes are not padded and whose amounts are non-negative constants; else None."""
    if attr(pad, "mode", b"constant") not in (b"constant", "constant"):
        return None
    if opset < 11:
        pads, value = attr(pad, "pads"), attr(pad, "value", 0.0)
    else:
        pads = constant(g, pad.input[1]) if len(pad.input) > 1 and pad.input[1] else None
        value = constant(g, pad.input[2]) if len(pad.input) > 2 and pad.input[2] else 0.0
        if len(pad.input) > 3 and pad.input[3]:
            return None                              # Pad-18 axes: rare; keep the Pad
    if pads is None or value is None or np.any(np.asarray(value) != 0):
        return None
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    rank = len(pads) // 2
    if rank < 3 or any(p < 0 for p in pads) or pads[0] or pads[1] or pads[rank] or pads[rank + 1]:
        return None
    return pads


def _takes(conv: onnx.NodeProto, tensor: str, rank: int) -> bool:
    """`conv` is a Conv reading `tensor` as its data (only), with explicit padding."""
    return (conv.op_type == "Conv" and conv.domain in ("", "ai.onnx") and conv.input[0] == tensor
            and tensor not in conv.input[1:] and attr(conv, "auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET")
            and len(attr(conv, "pads", [0] * (2 * (rank - 2)))) == 2 * (rank - 2))
