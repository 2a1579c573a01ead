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

The padded channels also flow on, as onnxruntime's NCHWc transformer carries them (flows_through):
through pooling and spatial means (an SE block's squeeze), through depthwise convs (each computes
the padded channels with zero filters: MobileNetV3's 72- and 120-channel depthwise convs then run
blocked instead of NCHW), into a grouped conv as extra zero groups where the padding holds
whole groups (RegNetY's 24 channels in groups of 8, padded to 32: a fourth group of zero filters),
and into a plain conv's input channels, where zero weights absorb them and no slice is left at
all. The layout search (propagate.decide_layouts) follows the same rule, so the convs it scores
are the convs this rewrite makes (sites_match checks it).
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
POOLS = {"relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d"}
REDUCTIONS = {"relax.mean", "relax.sum", "relax.max", "relax.min"}


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
    (each group's channels followed by its padding). Not `finite` once an op that can turn the
    padded channels' values (a bias, the ops after it) into NaN or infinity ran on them: a square
    root, a power, a division by a tensor. A conv then does not take them, as 0 x NaN is NaN."""

    channels: int
    padded: int
    groups: int = 1
    finite: bool = True

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


def op_name(call) -> str | None:
    return getattr(getattr(call, "op", None), "name", None)


def is_plain_conv(call) -> bool:
    """A conv2d in ONNX layouts (NCHW / OIHW) with a constant weight."""
    if op_name(call) != "relax.nn.conv2d" or not is_const(call.args[1]):
        return False
    a = call.attrs
    return (a.data_layout, a.kernel_layout, a.out_layout or "NCHW") == ("NCHW", "OIHW", "NCHW")


def is_depthwise(call) -> bool:
    """A conv computing each channel from its own input channel alone (one filter per group)."""
    if not is_plain_conv(call):
        return False
    o, per_group = (int(call.args[1].ty.shape[i]) for i in (0, 1))
    return per_group == 1 and int(call.attrs.groups) == o == int(call.args[0].ty.shape[1])


def is_grouped(call) -> bool:
    """A plain conv in more than one group that is not depthwise (RegNet's, ResNeXt's)."""
    return is_plain_conv(call) and int(call.attrs.groups) > 1 and not is_depthwise(call)


def extra_groups(call, pad: "Padding") -> int:
    """How many whole groups of zero channels a grouped conv reads in `pad`'s padding: > 0 when
    the padding (the real channels first) holds whole groups of the conv's input channels per
    group. RegNetY-200MF's 24 channels in 3 groups of 8, padded to 32: one more group, whose
    zero filters compute 8 zero output channels, so the output is padded as well."""
    per_group = int(call.args[1].ty.shape[1])
    extra = pad.padded - pad.channels
    return extra // per_group if pad.groups == 1 and extra > 0 and extra % per_group == 0 else 0


def takes_padding(call, pad: "Padding | None" = None) -> bool:
    """A conv that can read padded channels: a depthwise conv computes them on (zero filters), a
    plain (ungrouped) one absorbs them (zero weights for them count nothing), a grouped one reads
    `pad` as extra zero groups where it holds whole groups (extra_groups)."""
    if is_depthwise(call) or (is_plain_conv(call) and int(call.attrs.groups) == 1):
        return True
    return pad is not None and is_grouped(call) and extra_groups(call, pad) > 0


def read_output_padding(call, pad_in: "Padding | None") -> "Padding | None":
    """The padding a conv that takes `pad_in` computes its output with: a depthwise conv keeps
    its input's, a grouped one adds its extra groups' zero outputs, a plain one absorbs it (and
    None without padding in)."""
    if pad_in is None:
        return None
    if is_depthwise(call):
        return pad_in
    if is_grouped(call):
        o, groups = int(call.args[1].ty.shape[0]), int(call.attrs.groups)
        return Padding(o, o + extra_groups(call, pad_in) * (o // groups))
    return None


def channelwise(call) -> bool:
    """Channel c of the result depends on channel c of the tensor operands only."""
    op = op_name(call)
    if op in UNARY or op in BINARY:
        return True
    if op in POOLS:
        return str(call.attrs.layout) == "NCHW"
    if op in REDUCTIONS and getattr(call.attrs, "keepdims", False) and call.attrs.axis is not None:
        return len(call.args[0].ty.shape) == 4 and all(int(a) % 4 in (2, 3) for a in call.attrs.axis)
    return False


def flows_through(call, padding_of, flow: bool = True) -> "Padding | None":
    """The padding `call`'s result keeps when it reads padded tensors (`padding_of(arg)`: the
    Padding an operand is computed with, else None): a depthwise conv keeps its input's; a
    channel-wise op keeps the one padding all its tensor operands share, when its constants
    broadcast per channel. None where the channels must be taken back first. The layout search's
    walk and the rewrite both decide by this function. Without `flow`, padding moves through
    element-wise ops only (the conv's epilogue)."""
    if not flow and op_name(call) not in UNARY | BINARY:
        return None
    if is_depthwise(call):
        return padding_of(call.args[0])
    if not channelwise(call):
        return None
    pads = [padding_of(a) for a in call.args if isinstance(a, relax.Var)]
    if not pads or None in pads or len(set(pads)) != 1:
        return None
    pad = pads[0]
    for a in call.args:
        if not isinstance(a, relax.Var) and not (is_const(a) and pad.constant(a.value.numpy()) is not None):
            return None
    op = op_name(call)
    if op in ("relax.sqrt", "relax.power") or (op == "relax.divide" and isinstance(call.args[1], relax.Var)):
        return replace(pad, finite=False)
    return pad


def taken(call, pad: "Padding | None") -> "Padding | None":
    """The padding conv `call` reads and takes (takes_padding): `pad` when it is finite and the
    conv can, else None."""
    return pad if pad is not None and pad.finite and takes_padding(call, pad) else None


def _pad_conv_weight(call, value: np.ndarray, pad_in: Padding) -> np.ndarray:
    """The weight of a conv reading `pad_in`-padded channels: zero filters for the padded
    channels of a depthwise conv and for a grouped conv's extra groups, zero input channels for
    a plain one."""
    if is_grouped(call):
        out = read_output_padding(call, pad_in)
        return np.pad(value, [(0, out.padded - out.channels)] + [(0, 0)] * (value.ndim - 1))
    return _pad_groups(value, 0 if is_depthwise(call) else 1, pad_in.groups, pad_in.padded // pad_in.groups,
                       "constant")


@relax.expr_functor.mutator
class _PadOutputs(relax.PyExprMutator):
    """Pads the chosen convs' filters and moves each slice down as far as flows_through allows:
    past the epilogue, through depthwise convs and pooling, into the input of the convs reading it."""

    def __init__(self, mod: tvm.IRModule, padded: dict, flow: bool):
        super().__init__(mod)
        self.padded = padded              # weight constant -> output channels to compute
        self.flow = flow                  # padded channels flow into convs (else: taken back before them)
        self.new_weights: dict = {}       # old weight constant -> new (padded) one
        self.sliced: dict = {}            # a take-back we made -> (padded var, Padding)

    def visit_call_(self, call):
        weight = call.args[1] if op_name(call) == "relax.nn.conv2d" else None
        call = super().visit_call_(call)
        if weight is not None:
            return self._conv(call, weight)
        pad = flows_through(call, self._padding_of, self.flow)
        return self._through(call, pad) if pad is not None else call

    def _conv(self, call, weight):
        """The conv reading padded channels where it can (a depthwise conv computes them too), and
        computing its output channels padded where chosen."""
        pad_in = taken(call, self._padding_of(call.args[0])) if self.flow else None
        chosen = next((n for w, n in self.padded.items() if weight.same_as(w)), None)
        if pad_in is None and chosen is None:
            return call
        value = weight.value.numpy()
        groups, pad_out = int(call.attrs.groups), None
        if pad_in is not None:
            value = _pad_conv_weight(call, value, pad_in)
            pad_out = read_output_padding(call, pad_in)
            if pad_out is not None:                    # depthwise: one group per channel; grouped: extra groups
                groups = pad_in.padded // int(call.args[1].ty.shape[1])
        if chosen is not None:
            assert pad_out is None, "a conv computing its input's padding on does not pad its output again"
            pad_out = Padding(value.shape[0], chosen, groups)
            value = pad_filters(value, chosen, groups)
        new = relax.const(value, str(value.dtype))
        self.new_weights[weight] = new
        data = self._sliced(call.args[0])[0] if pad_in is not None else call.args[0]
        a = call.attrs
        conv = self.builder_.emit(relax.op.nn.conv2d(
            data, new, a.strides, a.padding, a.dilation, groups, a.data_layout, a.kernel_layout, a.out_layout,
            a.out_dtype))
        return self._take_back(conv, pad_out) if pad_out is not None else conv

    def _take_back(self, padded_var, pad: Padding):
        out = pad.take_back(self.builder_, padded_var)
        self.sliced[out] = (padded_var, pad)
        return out

    def _sliced(self, arg):
        """(padded var, Padding) when `arg` is bound to one of our take-backs, else None."""
        return self.sliced.get(self.lookup_binding(arg)) if isinstance(arg, relax.Var) else None

    def _padding_of(self, arg) -> Padding | None:
        found = self._sliced(arg)
        return found[1] if found is not None else None

    def _through(self, call, pad: Padding):
        """op(take(x), consts...) -> take(op(x, padded consts...))."""
        args = []
        for a in call.args:
            if isinstance(a, relax.Var):
                args.append(self._sliced(a)[0])
            else:
                value = pad.constant(a.value.numpy())
                args.append(relax.const(value, str(value.dtype)))
        return self._take_back(self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args)), pad)


def pad_conv_outputs(mod: tvm.IRModule, padded: dict, flow: bool = True) -> tuple[tvm.IRModule, dict]:
    """`mod` with each conv whose weight constant is a key of `padded` computing that many output
    channels (each group padded alike), taken back, the padding flowing on (flows_through); and the
    map old weight -> new weight constant (of the padded convs and of the convs reading padding)."""
    if not padded:
        return mod, {}
    m = _PadOutputs(mod, padded, flow)
    out = relax.transform.DeadCodeElimination()(rewrite_functions(m, mod))
    return out, m.new_weights


def output_padding(site, d) -> Padding | None:
    """How a conv computes its output channels under decision `d` (a layout search site and
    Decision): padded to whole output blocks when `d` says so, else None."""
    if not d.padded_from:
        return None
    return Padding(site.out_channels, site.groups * padded_channels(site.out_channels // site.groups, d.out_block),
                   site.groups)


def apply_padding(mod: tvm.IRModule, decisions: list, flow: bool = True) -> tuple[tvm.IRModule, list]:
    """The convs whose decision pads their output channels rewritten (pad_conv_outputs), and the
    decisions re-keyed to the new weight constants and padded sites (a site reading padded
    channels was scored as such already)."""
    chosen = {w: p.padded for w, s, d in decisions if (p := output_padding(s, d)) is not None}
    mod, new = pad_conv_outputs(mod, chosen, flow)
    return mod, [(new.get(w, w), replace(s, weight=(chosen[w], *s.weight[1:])) if w in chosen else s, d)
                 for w, s, d in decisions]
