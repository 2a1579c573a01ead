"""Output channels padded to whole vector blocks (as onnxruntime's NCHWc transformer does).

A conv whose output channels are not a multiple of the vector width (a classifier's 1000, an
STFT's 257, a detection head's 18) cannot write NCHW{v}c, and in NCHW its stores are W-strided
vectors with tails: SqueezeNet's 512 -> 1000 1x1 conv ran at a third of its 3x3 convs' speed.
Where the layout search finds it faster (search.LayoutSearch.decide), the conv computes
ceil(O / v) * v channels from a weight padded with zero filters, and a strided_slice takes the
first O back. The slice is moved down through the element-wise ops that follow (a bias add, a
ReLU, a BatchNorm's scale and shift: their per-channel constants padded with their last value),
so the conv kernel keeps its epilogue and the channels are dropped once, where the packed layout
ends anyway (propagation converts to NCHW in front of the slice).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import tvm
from tvm import relax

from ..relax_util import is_const, rewrite_functions

# Element-wise ops the slice moves through: channel c of the result depends on channel c only.
UNARY = {"relax.nn.relu", "relax.sigmoid", "relax.tanh", "relax.nn.silu", "relax.nn.gelu", "relax.exp",
         "relax.negative", "relax.sqrt", "relax.abs", "relax.square"}
BINARY = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum",
          "relax.power"}


def padded_channels(channels: int, lanes: int) -> int:
    """`channels` rounded up to whole blocks of `lanes`."""
    return -(-channels // lanes) * lanes


def pad_filters(weight: np.ndarray, out_channels: int) -> np.ndarray:
    """OIHW weight with zero filters appended up to `out_channels`."""
    extra = out_channels - weight.shape[0]
    return np.pad(weight, [(0, extra)] + [(0, 0)] * (weight.ndim - 1))


def _pad_channel_constant(value: np.ndarray, channels: int, padded: int) -> np.ndarray | None:
    """A constant operand of an element-wise op on an NCHW tensor of `channels` channels, made to
    broadcast against `padded` channels: unchanged when it does already (a scalar, or size 1 on
    the channel axis), padded with its last channel's value when it holds one value per channel;
    None when it broadcasts some other way."""
    if value.ndim < 3 or value.shape[-3] == 1:
        return value
    if value.shape[-3] != channels:
        return None
    widths = [(0, 0)] * value.ndim
    widths[-3] = (0, padded - channels)
    return np.pad(value, widths, mode="edge")


@relax.expr_functor.mutator
class _PadOutputs(relax.PyExprMutator):
    """Pads the chosen convs' filters and moves each slice down the element-wise ops after it."""

    def __init__(self, mod: tvm.IRModule, padded: dict):
        super().__init__(mod)
        self.padded = padded              # weight constant -> output channels to compute
        self.new_weights: dict = {}       # old weight constant -> new (padded) one
        self.sliced: dict = {}            # a slice we made -> (padded var, channels)

    def visit_call_(self, call):
        weight = call.args[1] if getattr(call.op, "name", None) == "relax.nn.conv2d" else None
        call = super().visit_call_(call)
        op = getattr(call.op, "name", None)
        if weight is not None:
            for w, channels in self.padded.items():
                if weight.same_as(w):
                    return self._conv(call, w, channels)
        if op in UNARY or op in BINARY:
            return self._through(call)
        return call

    def _conv(self, call, weight, padded: int):
        value = weight.value.numpy()
        new = relax.const(pad_filters(value, padded), str(value.dtype))
        self.new_weights[weight] = new
        conv = self.builder_.emit(relax.Call(call.op, [call.args[0], new], call.attrs, call.ty_args))
        return self._slice(conv, value.shape[0])

    def _slice(self, padded_var, channels: int):
        """The slice (returned unbound: the mutator binds it to the original op's variable)."""
        out = relax.op.strided_slice(padded_var, axes=[1], begin=[0], end=[channels])
        self.sliced[out] = (padded_var, channels)
        return out

    def _sliced(self, arg):
        """(padded var, channels) when `arg` is bound to one of our slices, else None."""
        return self.sliced.get(self.lookup_binding(arg)) if isinstance(arg, relax.Var) else None

    def _through(self, call):
        """op(slice(x), consts...) -> slice(op(x, padded consts...)) when every tensor operand is
        a slice of the same width and every constant broadcasts per channel; else `call`."""
        found = [s for a in call.args if (s := self._sliced(a)) is not None]
        if not found or len({(int(p.ty.shape[1]), c) for p, c in found}) != 1:
            return call
        padded, channels = int(found[0][0].ty.shape[1]), found[0][1]
        args = []
        for a in call.args:
            if (s := self._sliced(a)) is not None:
                args.append(s[0])
            elif is_const(a):
                value = _pad_channel_constant(a.value.numpy(), channels, padded)
                if value is None:
                    return call
                args.append(relax.const(value, str(value.dtype)))
            else:
                return call
        return self._slice(self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args)), channels)


def pad_conv_outputs(mod: tvm.IRModule, padded: dict) -> tuple[tvm.IRModule, dict]:
    """`mod` with each conv whose weight constant is a key of `padded` computing that many output
    channels, sliced back; and the map old weight -> new weight constant."""
    if not padded:
        return mod, {}
    m = _PadOutputs(mod, padded)
    out = relax.transform.DeadCodeElimination()(rewrite_functions(m, mod))
    return out, m.new_weights


def apply_padding(mod: tvm.IRModule, decisions: list) -> tuple[tvm.IRModule, list]:
    """The convs whose decision pads their output channels rewritten (pad_conv_outputs), and the
    decisions re-keyed to the new weight constants and padded sites."""
    chosen = {w: padded_channels(s.out_channels, d.out_block) for w, s, d in decisions if d.padded_from}
    mod, new = pad_conv_outputs(mod, chosen)
    return mod, [(new[w], replace(s, weight=(chosen[w], *s.weight[1:])), d) if w in new else (w, s, d)
                 for w, s, d in decisions]
