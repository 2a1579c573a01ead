"""Output channels padded to whole vector blocks (as onnxruntime's NCHWc transformer does).

A conv whose output channels are not a multiple of the vector width (a classifier's 1000, an
STFT's 257, a detection head's 18) cannot write NCHW{v}c, and in NCHW its stores are W-strided
vectors with tails (openWakeWord's two 257-channel STFT convs: 0.33 ms, padded 0.05 ms).
Where the layout search finds it faster (search.LayoutSearch.decide), the conv computes
ceil(O / v) * v channels from a weight padded with zero filters, and a strided_slice takes the
first O back. The slice is moved down through the element-wise ops that follow (a bias add, a
ReLU, a BatchNorm's scale and shift: their per-channel constants padded with their last value),
so the conv kernel keeps its epilogue and the channels are dropped once, where the packed layout
ends anyway (propagation converts to NCHW in front of the slice). A grouped conv pads each group
(ShuffleNet's 68 channels per group -> 72) and takes them back with reshape, slice, reshape.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

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


def _pad_groups(value: np.ndarray, axis: int, groups: int, per_group: int, mode: str) -> np.ndarray:
    """`value` with each of its `groups` runs along `axis` padded at its end to `per_group`."""
    shape = value.shape
    split = value.reshape(shape[:axis] + (groups, shape[axis] // groups) + shape[axis + 1:])
    widths = [(0, 0)] * split.ndim
    widths[axis + 1] = (0, per_group - shape[axis] // groups)
    padded = np.pad(split, widths, mode=mode)
    return padded.reshape(shape[:axis] + (groups * per_group,) + shape[axis + 1:])


def pad_filters(weight: np.ndarray, out_channels: int, groups: int = 1) -> np.ndarray:
    """OIHW weight with zero filters appended to each group, up to `out_channels` in all."""
    return _pad_groups(weight, 0, groups, out_channels // groups, "constant")


@dataclass(frozen=True)
class Padding:
    """A conv output computed padded: `channels` real ones in `groups` groups, `padded` in all
    (each group's channels followed by its padding)."""

    channels: int
    padded: int
    groups: int = 1

    def constant(self, value: np.ndarray) -> np.ndarray | None:
        """A constant operand of an element-wise op on the NCHW tensor, made to broadcast against
        the padded one: unchanged when it does already (a scalar, or size 1 on the channel axis),
        each group padded with its last channel's value when it holds one value per channel;
        None when it broadcasts some other way."""
        if value.ndim < 3 or value.shape[-3] == 1:
            return value
        if value.shape[-3] != self.channels:
            return None
        return _pad_groups(value, value.ndim - 3, self.groups, self.padded // self.groups, "edge")

    def take_back(self, bb: relax.BlockBuilder, padded_var) -> relax.Expr:
        """The real channels of `padded_var` (the last op returned unbound)."""
        if self.groups == 1:
            return relax.op.strided_slice(padded_var, axes=[1], begin=[0], end=[self.channels])
        n, _, h, w = (int(d) for d in padded_var.ty.shape)
        g = self.groups
        split = bb.emit(relax.op.reshape(padded_var, (n, g, self.padded // g, h, w)))
        kept = bb.emit(relax.op.strided_slice(split, axes=[2], begin=[0], end=[self.channels // g]))
        return relax.op.reshape(kept, (n, self.channels, h, w))


@relax.expr_functor.mutator
class _PadOutputs(relax.PyExprMutator):
    """Pads the chosen convs' filters and moves each slice down the element-wise ops after it."""

    def __init__(self, mod: tvm.IRModule, padded: dict):
        super().__init__(mod)
        self.padded = padded              # weight constant -> output channels to compute
        self.new_weights: dict = {}       # old weight constant -> new (padded) one
        self.sliced: dict = {}            # a take-back we made -> (padded var, Padding)

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
        pad = Padding(value.shape[0], padded, int(call.attrs.groups))
        new = relax.const(pad_filters(value, padded, pad.groups), str(value.dtype))
        self.new_weights[weight] = new
        conv = self.builder_.emit(relax.Call(call.op, [call.args[0], new], call.attrs, call.ty_args))
        return self._take_back(conv, pad)

    def _take_back(self, padded_var, pad: Padding):
        out = pad.take_back(self.builder_, padded_var)
        self.sliced[out] = (padded_var, pad)
        return out

    def _sliced(self, arg):
        """(padded var, Padding) when `arg` is bound to one of our take-backs, else None."""
        return self.sliced.get(self.lookup_binding(arg)) if isinstance(arg, relax.Var) else None

    def _through(self, call):
        """op(take(x), consts...) -> take(op(x, padded consts...)) when every tensor operand is
        taken back from the same padding and every constant broadcasts per channel; else `call`."""
        found = [s for a in call.args if (s := self._sliced(a)) is not None]
        if not found or len({pad for _, pad in found}) != 1:
            return call
        pad = found[0][1]
        args = []
        for a in call.args:
            if (s := self._sliced(a)) is not None:
                args.append(s[0])
            elif is_const(a):
                value = pad.constant(a.value.numpy())
                if value is None:
                    return call
                args.append(relax.const(value, str(value.dtype)))
            else:
                return call
        return self._take_back(self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args)), pad)


def pad_conv_outputs(mod: tvm.IRModule, padded: dict) -> tuple[tvm.IRModule, dict]:
    """`mod` with each conv whose weight constant is a key of `padded` computing that many output
    channels (each group padded alike), taken back; and the map old weight -> new weight constant."""
    if not padded:
        return mod, {}
    m = _PadOutputs(mod, padded)
    out = relax.transform.DeadCodeElimination()(rewrite_functions(m, mod))
    return out, m.new_weights


def apply_padding(mod: tvm.IRModule, decisions: list) -> tuple[tvm.IRModule, list]:
    """The convs whose decision pads their output channels rewritten (pad_conv_outputs), and the
    decisions re-keyed to the new weight constants and padded sites."""
    chosen = {w: s.groups * padded_channels(s.out_channels // s.groups, d.out_block)
              for w, s, d in decisions if d.padded_from}
    mod, new = pad_conv_outputs(mod, chosen)
    return mod, [(new[w], replace(s, weight=(chosen[w], *s.weight[1:])), d) if w in new else (w, s, d)
                 for w, s, d in decisions]
