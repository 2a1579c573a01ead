"""int8 execution of QDQ models (issue 47): a MatMul, Gemm or 1-D/2-D Conv whose activation is
dequantized from an 8-bit tensor (one scale and zero point) and whose weight is a dequantized
constant (8-bit, per-tensor or per-output-channel scales) computes in integers:

    y = float(sum_k (x_q - x_zp) * (w_q - w_zp)) * (x_scale * w_scale)

the sum exact in int32, the weights minus their zero point int8 panels in the package (a quarter
of their float32 size), the float scale the kernel's epilogue. This is the formula onnxruntime's
int8 kernels compute; the float path computed the same sum of dequantized values with float32
rounding in every partial sum. The CPU int-dot rule (schedule/rules/int_dot.py) schedules the
kernel, in the first of the target's integer dot forms (`IntDot`) that takes it:

* QUAD (AVX-512 VNNI): the activation is x_q itself as uint8 (an int8 x_q offset by 128), the
  weights [N/16, K/4, 16, 4] panels, and the kernel subtracts x_zp * (sum of an output's weights)
  from the sums. A matmul needs K a multiple of 4.
* PAIR (any CPU): the activation is x_q - x_zp as int16, the weights [N/8, K/2, 8, 2] panels.
* TILE (AMX-INT8, a target that names such a CPU) comes first where it fits: int8_tiles.py.

N (a conv's output channels) need not be whole panels: the last panel is padded with zero
columns, its sums computed in registers and only the real ones written (ShuffleNetV2's 58, 116
and 232 channels), as long as it holds at least half real columns.

A convolution's activation is first laid out N[H]WC (channels in whole groups, the spatial padding
and the filling channels holding the activation's zero) so a group of channels is one 32-bit
load; its weights are panels [OC/L, *K, C/G, L, G]. The output stays NC[H]W, as the float graph
around it.

A conv the panels do not take (grouped or depthwise, fewer output channels than half a panel, a weight
zero point that takes w_q - w_zp out of int8) is computed exactly in float32 when it can be:
where the largest |x_q - x_zp| times the largest sum of |w_q - w_zp| over one output's products
stays below 2^24, every partial sum in any order is an integer float32 holds, so a float32 conv
of (x_q - x_zp) and (w_q - w_zp) is the int32 result to the bit. The layout pass blocks it and the
schedulers take it like any float conv (an NC[H]W integer kernel for depthwise convs ran 3.6x
onnxruntime's time on a YOLO11n node).

Not (yet) in integers, and counted in the report line by reason: matmuls of two activations
(attention), convs the panels do not take whose sums could pass 2^24, 3-D and transposed
convolutions, matmul weights whose zero point leaves int8 range, K odd or N under half a panel.
CUDA targets keep the float path (dp4a / integer tensor cores are not built).
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import tvm
from tvm import relax, tirx

from . import int8_tiles
from .base import PassReport
from .int8_kernels import PANEL, channels_last_pad, int_conv, int_matmul, pack_conv, pack_panels, padded  # noqa: F401
from .qdq_moves import EightBitMoves
from .relax_util import bound_value, is_const, rewrite_functions
from .schedule.contract import TILE_DOT, IntDot, tiled_rows

EXACT = 1 << 24    # float32 holds every integer up to 2^24 exactly
MAX_PADDING = 2    # panels may hold up to this many times the real columns (a partial last panel)
QUANTIZED = ("uint8", "int8")
GROUP_NAMES = {TILE_DOT.group: "AMX-INT8 tiles (tdpbusd)", 4: "u8 x s8 quads (vpdpbusd)", 2: "int16 x int8 pairs"}
LAYOUTS = {"relax.nn.conv1d": ("NCW", "OIW", "NCW"), "relax.nn.conv2d": ("NCHW", "OIHW", "NCHW")}
CONVS = {"relax.nn.conv3d": "3-D convolutions",
         "relax.nn.conv1d_transpose": "transposed convolutions", "relax.nn.conv2d_transpose": "transposed convolutions"}


def _exact_in_float32(x: relax.Call, w: np.ndarray) -> bool:
    """Whether every partial sum of (x_q - x_zp) * w, in any order, stays below 2^24 for any
    8-bit x_q: the largest |x_q - x_zp| times the largest sum of |w| over one output's products.
    Then float32 adds integers exactly, and a float32 conv computes the int32 result."""
    info = np.iinfo(str(x.args[0].ty.dtype))
    zp = int(_scalar(x.args[2]).flat[0])
    x_max = max(zp - int(info.min), int(info.max) - zp)
    return x_max * int(np.abs(w.astype(np.int64)).reshape(w.shape[0], -1).sum(axis=1).max()) < EXACT


def _static(*exprs: relax.Expr) -> bool:
    """Whether every expr's shape is known to the last dimension."""
    shapes = [getattr(e.ty, "shape", None) for e in exprs]
    return all(s is not None and all(isinstance(d, tirx.IntImm) for d in s.values) for s in shapes)


def _scalar(e) -> np.ndarray | None:
    return e.value.numpy() if is_const(e) and e.value.numpy().size == 1 else None


@relax.expr_functor.mutator
class _IntegerKernels(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, forms: tuple[IntDot, ...]):
        super().__init__(mod)
        self.tiles = TILE_DOT in forms          # AMX-INT8: convs and matmuls that fit take tiles first
        self.forms = tuple(f for f in forms if f != TILE_DOT)   # the target's integer dots, preferred first
        self.used: Counter = Counter()          # matmuls and convs per form (its group: 2 or 4)
        self.integer = 0                        # matmuls and convs in integers
        self.convs = 0
        self.exact = 0                          # of the convs: exact integer sums in float32
        self.padded = 0                         # matmuls and convs whose last panel is partly zero columns
        self.kept: Counter = Counter()          # why a dequantized matmul or conv stayed in float

    def _dequantized(self, e) -> relax.Call | None:
        v = bound_value(self, e)
        return v if isinstance(v, relax.Call) and getattr(v.op, "name", None) == "relax.dequantize" else None

    def _constant(self, e, ndim: int, out_axis: int) -> tuple[np.ndarray, np.ndarray] | str:
        """(w_q - w_zp as int16, its scale per index of out_axis) of a dequantized constant, or why
        not (the scale must be one per output channel, or one)."""
        dq = self._dequantized(e)
        if dq is None:
            return "weight not dequantized"
        if not is_const(dq.args[0]):
            return "two activations"
        if not all(is_const(x) for x in dq.args[1:3]):
            return "weight scale computed at run time"
        q, scale, zp = (x.value.numpy() for x in dq.args[:3])
        if q.ndim != ndim or str(q.dtype) not in QUANTIZED:
            return f"weight not a {ndim}-D 8-bit constant"
        shape = [1] * ndim
        shape[int(dq.attrs.axis) % ndim] = -1
        w = q.astype(np.int16) - zp.astype(np.int16).reshape(shape if zp.size > 1 else ())
        s = np.broadcast_to(scale.astype(np.float32).reshape(shape if scale.size > 1 else ()), q.shape)
        s = np.moveaxis(s, out_axis, 0).reshape(q.shape[out_axis], -1)
        if not (s == s[:, :1]).all():
            return "weight scale varies along K"
        return w, np.ascontiguousarray(s[:, 0])

    def _weight(self, e) -> tuple[np.ndarray, np.ndarray] | str:
        """A matmul's K x N weight (Gemm's transposed one too) and its per-column scale, or why not."""
        v = bound_value(self, e)
        if isinstance(v, relax.Call) and getattr(v.op, "name", None) == "relax.permute_dims" and v.ty.ndim == 2 \
                and (v.attrs.axes is None or [int(a) for a in v.attrs.axes] == [1, 0]):
            w = self._constant(v.args[0], 2, 0)
            return w if isinstance(w, str) else (np.ascontiguousarray(w[0].T), w[1])
        return self._constant(v, 2, 1)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        op = getattr(call.op, "name", None)
        if op in CONVS and self._dequantized(call.args[0]) is not None:
            self.kept[CONVS[op]] += 1
        if op in LAYOUTS and str(call.ty.dtype) == "float32":
            return self._conv(call)
        if op != "relax.matmul" or str(call.ty.dtype) != "float32":
            return call
        x, w = self._dequantized(call.args[0]), self._weight(call.args[1])
        if x is None:
            if not isinstance(w, str):
                self.kept["activation not dequantized"] += 1
            return call
        if isinstance(w, str):
            self.kept[w] += 1
            return call
        form, why = self._fit(x, w[0])
        if why:
            self.kept[why] += 1
            return call
        self.integer += 1
        rows = int(np.prod([int(d) for d in call.ty.shape.values[:-1]])) if _static(call, x.args[0]) else 0
        if rows and self.tiles and not int8_tiles.unfit(*w[0].shape, tiled_rows(rows)):
            self.used[TILE_DOT.group] += 1
            xi, zp = self._activation(x, TILE_DOT)
            acc = int8_tiles.matmul(self.builder_, xi, zp, w[0].astype(np.int8))
            return self._scaled(self._compensated(acc, zp, w[0].sum(axis=0), 1), x, w[1], 1)
        self.used[form.group] += 1
        xi, zp = self._activation(x, form)
        panels = pack_panels(w[0].astype(np.int8), form.lanes, form.group)
        self.padded += w[0].shape[1] % form.lanes != 0
        acc = self.builder_.emit_te(int_matmul, xi, relax.const(panels), w[0].shape[1],
                                    primfunc_name_hint="matmul_int8")
        return self._scaled(self._compensated(acc, zp, w[0].sum(axis=0), 1), x, w[1], 1)

    def _conv(self, call: relax.Call) -> relax.Expr:
        """A dequantized NC[H]W conv1d/conv2d in integers, or the call with its reason counted."""
        x = self._dequantized(call.args[0])
        if x is None:
            return call
        a, ndim, shape = call.attrs, call.ty.ndim, call.ty.shape.values
        w = self._constant(bound_value(self, call.args[1]), ndim, 0)
        form = self._conv_form(call, x, w)
        if isinstance(form, str) and form != "exact":
            self.kept[form] += 1
            return call
        self.integer += 1
        self.convs += 1
        if form == "exact":
            self.exact += 1
            return self._scaled(self._exact_float(call, x, w[0]), x, w[1], ndim)
        self.used[form.group] += 1
        sums = w[0].reshape(w[0].shape[0], -1).sum(axis=1)
        if form == TILE_DOT:
            xi, zp = self._activation(x, form)
            acc = int8_tiles.conv(self.builder_, call, xi, zp, w[0].astype(np.int8))
            return self._scaled(self._compensated(acc, zp, sums, ndim), x, w[1], ndim)
        pad, (xi, zp) = [int(p) for p in a.padding], self._activation(x, form)
        space, strides, dilation = [int(d) for d in shape[2:]], [int(v) for v in a.strides], [int(v) for v in a.dilation]
        xp = self.builder_.emit_te(channels_last_pad, xi, pad[:ndim - 2], pad[ndim - 2:], form.group, zp,
                                   primfunc_name_hint="channels_last_pad")
        panels = pack_conv(w[0].astype(np.int8), form.lanes, form.group)
        self.padded += w[0].shape[0] % form.lanes != 0
        acc = self.builder_.emit_te(int_conv, xp, relax.const(panels), space, strides, dilation, w[0].shape[0],
                                    primfunc_name_hint=f"conv{ndim - 2}d_int8")
        return self._scaled(self._compensated(acc, zp, sums, ndim), x, w[1], ndim)

    def _exact_float(self, call: relax.Call, x: relax.Call, w: np.ndarray) -> relax.Expr:
        """The conv of x_q - x_zp and w as float32 integers: the exact int32 sum (_exact_in_float32)."""
        bb = self.builder_
        xf = bb.emit(relax.op.astype(x.args[0], "float32"))
        zp = float(_scalar(x.args[2]).flat[0])
        if zp:
            xf = bb.emit(relax.op.subtract(xf, relax.const(np.float32(zp), "float32")))
        return bb.emit(relax.Call(call.op, [xf, relax.const(w.astype(np.float32))], call.attrs))

    def _conv_form(self, call: relax.Call, x: relax.Call, w: tuple | str) -> IntDot | str:
        """The integer dot form of the panels, "exact" (float32 integers: a grouped conv, or one the
        panels do not take, whose sums stay exact: _exact_in_float32), or why the conv stays in float."""
        a = call.attrs
        if (a.data_layout, a.kernel_layout, a.out_layout) != LAYOUTS[call.op.name]:
            return "convolution layout not NC[H]W"
        if not all(isinstance(d, tirx.IntImm) for d in call.ty.shape.values):
            return "convolution shape not static"
        if isinstance(w, str):
            return w
        why = self._activation_unfit(x)
        if why:
            return why
        exact = _exact_in_float32(x, w[0])
        if int(a.groups) > 1:
            return "exact" if exact else "grouped convolutions whose sums can pass 2^24"
        form, why = self._fit(x, w[0].reshape(w[0].shape[0], -1).T, conv=True)
        if not why and self.tiles and call.op.name == "relax.nn.conv2d":
            oc, c, kh, kw = w[0].shape
            oh, ow = (int(d) for d in call.ty.shape.values[2:])
            flat = (kh, kw) == (1, 1) and [int(v) for v in a.strides] == [1, 1] and not any(int(p) for p in a.padding)
            return TILE_DOT if not int8_tiles.unfit(c, oc, oh * ow if flat else ow) else form
        return form if not why else "exact" if exact else why

    @staticmethod
    def _activation_unfit(x: relax.Call) -> str:
        """Why the dequantized activation cannot feed an integer kernel, "" if it can."""
        x_scale, x_zp = _scalar(x.args[1]), _scalar(x.args[2])
        if x_scale is None or x_zp is None or str(x.args[0].ty.dtype) not in QUANTIZED:
            return "activation not per-tensor 8-bit"
        return "activation not a matrix" if x.args[0].ty.ndim < 2 else ""

    def _fit(self, x: relax.Call, w: np.ndarray, conv: bool = False) -> tuple[IntDot | None, str]:
        """The first of the target's forms whose panels take this activation and K x N weight, or
        why the last (the most general) does not. N may end in a partial panel that is at least
        half real columns (MAX_PADDING): the padded columns are zero weights whose sums stay in
        registers, cheaper than any float path (a QUAD step is 64 products, a float FMA 16). A
        conv's channels are padded to whole groups."""
        why = self._activation_unfit(x)
        if why:
            return None, why
        k, n = w.shape
        if w.min() < -128 or w.max() > 127:
            return None, "weight minus zero point leaves int8"
        for form in self.forms:
            why = (f"{'output channels' if conv else 'N'} fewer than half a panel of {form.lanes}"
                   if padded(n, form.lanes) > MAX_PADDING * n else
                   f"K not a multiple of {form.group}" if k % form.group and not conv else "")
            if not why:
                return form, ""
        return None, why

    def _activation(self, x: relax.Call, form: IntDot) -> tuple[relax.Expr, int]:
        """The activation the form reads and the value of a real zero in it: x_q - x_zp as int16
        (0), or x_q as uint8 (x_zp; an int8 x_q offset by 128). The quantizing kernel writes it."""
        zp = int(_scalar(x.args[2]).flat[0])
        signed = str(x.args[0].ty.dtype) == "int8"
        if form.activation == "uint8" and not signed:
            return x.args[0], zp
        wide = self.builder_.emit(relax.op.astype(x.args[0], "int16"))
        if form.activation == "uint8":
            shifted = self.builder_.emit(relax.op.add(wide, relax.const(np.int16(128), "int16")))
            return self.builder_.emit(relax.op.astype(shifted, "uint8")), zp + 128
        return (self.builder_.emit(relax.op.subtract(wide, relax.const(np.int16(zp), "int16"))) if zp else wide), 0

    def _compensated(self, acc: relax.Expr, zp: int, sums: np.ndarray, ndim: int) -> relax.Expr:
        """The int32 sums minus the activation zero's share, zp * (sum of an output's weights):
        what a uint8 activation adds over x_q - x_zp (padding holds zp, so every tap has it)."""
        if not zp:
            return acc
        share = (zp * sums.astype(np.int64)).astype(np.int32)
        share = share.reshape(-1, *[1] * (ndim - 2)) if ndim > 2 else share
        return self.builder_.emit(relax.op.subtract(acc, relax.const(share, "int32")))

    def _scaled(self, acc: relax.Expr, x: relax.Call, w_scale: np.ndarray, ndim: int) -> relax.Expr:
        """float(acc) * x_scale * w_scale, the scale per output channel (axis 1 of a conv's NC[H]W,
        the last of a matmul's: ndim 1) unless it is one."""
        scale = (np.float32(_scalar(x.args[1]).flat[0]) * w_scale).astype(np.float32)
        if scale.size > 1 and (scale != scale[0]).any():
            scale = scale.reshape(-1, *[1] * (ndim - 2)) if ndim > 2 else scale
        else:
            scale = np.float32(scale[0])
        if str(acc.ty.dtype) != "float32":
            acc = self.builder_.emit(relax.op.astype(acc, "float32"))
        return relax.op.multiply(acc, relax.const(scale, "float32"))


def integer_kernels(mod: tvm.IRModule, forms: tuple[IntDot, ...]) -> tuple[tvm.IRModule, PassReport]:
    """The module with its QDQ data movement on 8-bit values (qdq_moves.py) and its QDQ matmuls
    and convs in integers, in the target's integer dot forms (preferred first); the report counts
    them and the ones kept."""
    moves = EightBitMoves(mod)
    mod = rewrite_functions(moves, mod)
    if moves.moved:
        mod = relax.transform.DeadCodeElimination()(mod)
    m = _IntegerKernels(mod, forms)
    out = rewrite_functions(m, mod)
    kept = ", ".join(f"{n} {why}" for why, n in sorted(m.kept.items()))
    moved = (f"; {moves.ops} data movement op(s) on 8-bit values ({moves.moved} quantize/dequantize round trip(s) "
             "removed)" if moves.moved else "")
    details = {"integer": m.integer, "convs": m.convs, "exact": m.exact, "padded": m.padded, "kept": dict(m.kept),
               "groups": {str(g): n for g, n in sorted(m.used.items())},
               "moves": moves.ops, "round_trips": moves.moved}
    if not m.integer and not kept:
        return out, PassReport("int8", "applied", "no dequantized matmul or conv in the model" + moved, details)
    done = " and ".join(f"{n} {what}(s)" for n, what in ((m.integer - m.convs, "matmul"), (m.convs, "conv")) if n)
    exact = (f"; {m.exact} of the convs (grouped, or not fit for the panels): exact integer sums in float32, "
             "their weights float32 integers" if m.exact else "")
    groups = ", ".join(f"{n} as {GROUP_NAMES.get(g, g)}" for g, n in sorted(m.used.items(), reverse=True))
    exact += f"; {groups}" if len(forms) > 1 and groups else ""
    exact += f"; {m.padded} with N (output channels) padded to whole panels" if m.padded else ""
    return out, PassReport("int8", "applied", f"{done or 'nothing'} in int8 (int32 sums, int8 weights{exact})"
                           + moved + (f"; kept in float: {kept}" if kept else ""), details)
