"""derive's frontend from the Relax graph (EinNet §4): the operators the pass may rewrite, each as
its canonical expression, with what the packager would build without the rewrite (the baseline a
derived program is estimated and timed against).

- ConvTranspose (NCHW, IOHW, groups 1, dilation 1, no output padding): TVM lowers it as a direct
  conv over the zero-inserted input, R x S multiply-adds per output point and input channel.
- Conv (NCHW, OIHW, groups 1, a kernel larger than 1x1; strided and dilated included): the
  layout pass's packed conv (NCHW{v}c in and out). Its roofline equals the derived Matmul's
  (same multiply-adds), so a conv is only worth deriving where timing says so: it is searched and
  timed at `optimize.level: 3` on targets timed here, and left alone otherwise.
A 1x1 conv is a matmul already; grouped convs and other layouts are not derived in this version.
Sites are keyed by shape and attributes: one decision serves every call with that key.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from tvm import relax, tirx

from ..relax_util import is_const
from .cost import roofline_ms
from .expr import Scope
from .operators import conv2d, conv_transpose2d

CONV_T = "relax.nn.conv2d_transpose"
CONV = "relax.nn.conv2d"
OPS = {CONV_T: "ConvTranspose", CONV: "Conv"}


@dataclass(frozen=True)
class Operator:
    """One call as derive sees it."""

    op: str                                  # ConvTranspose | Conv
    key: str                                 # shapes + attributes
    data: tuple[int, ...]
    weight: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]
    dilation: tuple[int, ...]
    expr: Scope

    @property
    def timed_only(self) -> bool:
        """The estimate cannot show a gain (same multiply-adds): decided by timing alone."""
        return self.op == "Conv"

    def original_estimate_ms(self, hw) -> float:
        """The roofline of what runs without the rewrite."""
        n, f, ho, wo = self.expr.shape
        c, r, s = (self.weight[0], *self.weight[2:]) if self.op == "ConvTranspose" else self.weight[1:]
        work = 2 * n * f * ho * wo * c * r * s
        return roofline_ms(work, 4 * (math.prod(self.data) + math.prod(self.weight) + n * f * ho * wo), hw)

    def original(self, lanes: int) -> tirx.PrimFunc:
        """What the packager builds without the rewrite, as a PrimFunc to time."""
        if self.op == "Conv":
            from ..layout.sites import ConvSite

            site = ConvSite(self.data, self.weight, self.strides, self.pads, self.dilation, 1, "float32")
            block = lanes if site.valid(lanes, lanes) else 1
            return site.kernel(block, block)
        from .timing import original_conv_transpose

        return original_conv_transpose(self.data, self.weight, self.strides, self.pads)


def frontend(call: relax.Call) -> tuple[Operator | None, str]:
    """The call's operator, or None and why this version leaves it alone."""
    op = OPS[call.op.name]
    a = call.attrs
    if not is_const(call.args[1]):
        return None, "weight is not a constant"
    layouts = (a.data_layout, a.kernel_layout, a.out_layout or a.data_layout)
    if layouts != ("NCHW", "IOHW" if op == "ConvTranspose" else "OIHW", "NCHW"):
        return None, "layouts " + "/".join(layouts)
    try:
        data = tuple(int(d) for d in call.args[0].ty.shape)
        weight = tuple(int(d) for d in call.args[1].ty.shape)
    except (TypeError, AttributeError):
        return None, "symbolic shape"
    if str(call.args[0].ty.dtype) != "float32":
        return None, f"dtype {call.args[0].ty.dtype}"
    strides, pads = tuple(int(s) for s in a.strides), tuple(int(p) for p in a.padding)
    dilation = tuple(int(d) for d in a.dilation)
    if int(a.groups) != 1:
        return None, "groups > 1 (not derived in this version)"
    if op == "ConvTranspose":
        if any(d != 1 for d in dilation) or any(int(p) for p in a.output_padding):
            return None, "dilation or output padding (not derived in this version)"
        expr = conv_transpose2d(data, weight, strides, pads)
    else:
        if weight[2] * weight[3] == 1:
            return None, "a 1x1 conv is a matmul already"
        expr = conv2d(data, weight, strides, pads, dilation)
    key = json.dumps([op, data, weight, strides, pads, dilation])
    return Operator(op, key, data, weight, strides, pads, dilation, expr), ""


def site_key(call: relax.Call) -> str | None:
    """The key of a call derive may rewrite (None for other calls)."""
    if getattr(call.op, "name", None) not in OPS:
        return None
    operator, _ = frontend(call)
    return operator.key if operator is not None else None
