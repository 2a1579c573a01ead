"""`optimize.precision: bf16` (issue 47): a target's convs and matmuls with constant weights compute
on bf16 operands with float32 sums, their weights stored as bf16 panels (half their float32 size);
everything else stays float32, so the keep-in-fp32 list holds by construction.

Each conv2d (NCHW, one group) and each matmul of an activation and a constant K x N weight becomes
two kernels: the activation rounded to bf16 (round to nearest even; a conv's also laid out
channels-last with its spatial padding, int8.py's channels_last_pad) and a TileDot kernel
(schedule/rules/tile_dot.py) over it and the packed weights, float32 out in the layout the graph
had (NC[H]W, a matmul's rows). bf16 values are stored as uint16: TVM legalizes bfloat16-typed
values to float32 before LLVM sees them. The CPU rules compute TileDot kernels on AMX tiles.

Kept in float32, counted by reason: input channels (K) below 64 that are not a multiple of 32
(padding them would multiply zeros: a 3-channel stem conv would do 10x its work), output channels
(N) not a multiple of 16, a conv's rows of output positions with no divisor from 4 to 16 (an
accumulator tile's rows; a matmul's rows are padded to 16 instead), grouped and 1-D/3-D convs,
matmuls of two activations.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import tvm
from tvm import relax, te, tirx

from .base import PassReport
from .int8_kernels import channels_last_pad, padded_rows
from .relax_util import bound_value, is_const, rewrite_functions
from .schedule.contract import TILE_CHUNK as CHUNK, TILE_PANEL as PANEL, TileDot, reference_kernel, \
    tile_channels, tile_unfit, tiled_rows



def bf16_bits(v: tirx.PrimExpr) -> tirx.PrimExpr:
    """float32 -> bf16 bits (uint16), rounded to nearest even; a NaN stays a (quiet) NaN."""
    u = tirx.reinterpret("uint32", v)
    rounded = (u + tirx.const(0x7FFF, "uint32") + ((u >> tirx.const(16, "uint32")) & tirx.const(1, "uint32"))) \
        >> tirx.const(16, "uint32")
    nan = (u & tirx.const(0x7FFFFFFF, "uint32")) > tirx.const(0x7F800000, "uint32")
    quiet = (u >> tirx.const(16, "uint32")) | tirx.const(0x40, "uint32")
    return tirx.Cast("uint16", tirx.Select(nan, quiet, rounded))


def bf16_numpy(w: np.ndarray) -> np.ndarray:
    """float32 array -> bf16 bits (uint16), rounded as bf16_bits does."""
    u = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    quiet = (u >> 16) | 0x40
    return np.where((u & 0x7FFFFFFF) > 0x7F800000, quiet, rounded).astype(np.uint16)


def bf16_rows(x: te.Tensor, channels: int, rows: int) -> te.Tensor:
    """[M, K] float32 -> [1, 1, rows, channels] bf16 bits, K zero-padded to `channels` and M to `rows`."""
    return padded_rows(x, channels, rows, 0, "uint16", bf16_bits, name="bf16_rows")


def pack_bf16(w: np.ndarray, channels: int) -> np.ndarray:
    """OC x C x KH x KW float32 -> [OC/16, KH, KW, channels/2, 16, 2] bf16 bits, C zero-padded."""
    oc, c, kh, kw = w.shape
    w = np.pad(bf16_numpy(w), [(0, 0), (0, channels - c), (0, 0), (0, 0)])
    return np.ascontiguousarray(w.reshape(oc // PANEL, PANEL, channels // 2, 2, kh, kw).transpose(0, 4, 5, 2, 1, 3))


def _static(e: relax.Expr) -> bool:
    """Whether e's shape is known to the last dimension (a profile binds every input's)."""
    shape = getattr(e.ty, "shape", None)
    return shape is not None and all(isinstance(d, tirx.IntImm) for d in shape.values)


@relax.expr_functor.mutator
class _TileDots(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.convs = 0
        self.matmuls = 0
        self.kept: Counter = Counter()

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        op = getattr(call.op, "name", None)
        if op in ("relax.nn.conv1d", "relax.nn.conv3d"):
            self.kept["1-D and 3-D convolutions"] += 1
        if op not in ("relax.nn.conv2d", "relax.matmul") or str(call.ty.dtype) != "float32":
            return call
        if not (_static(call) and _static(call.args[0])):
            self.kept["shapes not static"] += 1
            return call
        return self._conv(call) if op == "relax.nn.conv2d" else self._matmul(call)

    def _conv(self, call: relax.Call) -> relax.Expr:
        a, w = call.attrs, bound_value(self, call.args[1])
        if (a.data_layout, a.kernel_layout, a.out_layout) != ("NCHW", "OIHW", "NCHW") or int(a.groups) != 1:
            self.kept["grouped or not NCHW"] += 1
            return call
        if not is_const(w):
            self.kept["weight not a constant"] += 1
            return call
        weight = w.value.numpy()
        (n, c, h, wd), (oc, _, kh, kw) = (tuple(int(d) for d in s) for s in (call.args[0].ty.shape.values, weight.shape))
        oh, ow = (int(d) for d in call.ty.shape.values[2:])
        pad, strides, dil = [int(p) for p in a.padding], [int(s) for s in a.strides], [int(d) for d in a.dilation]
        flat = (kh, kw) == (1, 1) and strides == [1, 1] and not any(pad)
        channels = tile_channels("bf16", c)
        why = tile_unfit("bf16", c, oc, oh * ow if flat else ow)
        if why:
            self.kept[why] += 1
            return call
        self.convs += 1
        bb = self.builder_
        xp = bb.emit_te(lambda x: channels_last_pad(x, pad[:2], pad[2:], CHUNK, 0, bf16_bits, "uint16"), call.args[0],
                        primfunc_name_hint="bf16_channels_last")
        g = TileDot(n, h + pad[0] + pad[2], wd + pad[1] + pad[3], channels, oc, kh, kw,
                    *((1, oh * ow) if flat else (oh, ow)), *strides, *dil)
        out = self._tile_dot(g, xp, pack_bf16(weight, channels), relax.TensorType((n, oc, oh * ow), "float32"))
        return bb.emit(relax.op.reshape(out, (n, oc, oh, ow)))

    def _matmul(self, call: relax.Call) -> relax.Expr:
        x, w = call.args[0], bound_value(self, call.args[1])
        if not is_const(w) or w.value.numpy().ndim != 2 or x.ty.ndim < 2:
            if x.ty.ndim >= 2 and not is_const(w):
                self.kept["matmuls of two activations"] += 1
            return call
        weight = w.value.numpy()
        shape = [int(d) for d in x.ty.shape.values]
        k, n_out, m = shape[-1], int(weight.shape[1]), int(np.prod(shape[:-1]))
        channels = tile_channels("bf16", k)
        mp = tiled_rows(m)
        why = tile_unfit("bf16", k, n_out, mp)
        if why:
            self.kept[why] += 1
            return call
        self.matmuls += 1
        bb = self.builder_
        rows = bb.emit_te(bf16_rows, bb.emit(relax.op.reshape(x, (m, k))), channels, mp, primfunc_name_hint="bf16_rows")
        g = TileDot(1, 1, mp, channels, n_out, 1, 1, 1, mp, rows=True)
        panels = pack_bf16(np.ascontiguousarray(weight.T)[:, :, None, None], channels)
        out = self._tile_dot(g, rows, panels, relax.TensorType((mp, n_out), "float32"))
        if mp != m:
            out = bb.emit(relax.op.strided_slice(out, axes=[0], begin=[0], end=[m]))
        return bb.emit(relax.op.reshape(out, (*shape[:-1], n_out)))

    def _tile_dot(self, g: TileDot, x: relax.Expr, panels: np.ndarray, out: relax.TensorType) -> relax.Expr:
        gv = self.builder_.add_func(reference_kernel(g), "tile_dot_bf16")
        return self.builder_.emit(relax.call_tir(gv, [x, relax.const(panels)], out))


def tile_dots(mod: tvm.IRModule) -> tuple[tvm.IRModule, PassReport]:
    """The module with its convs and matmuls on bf16 operands where they fit; the report counts them
    and the ones kept in float32, by reason."""
    m = _TileDots(mod)
    out = relax.transform.DeadCodeElimination()(rewrite_functions(m, mod))
    kept = ", ".join(f"{n} {why}" for why, n in sorted(m.kept.items()))
    done = " and ".join(f"{n} {what}(s)" for n, what in ((m.convs, "conv"), (m.matmuls, "matmul")) if n)
    return out, PassReport("precision", "applied",
                           f"bf16: {done or 'nothing'} on bf16 operands with float32 sums, weights bf16 panels"
                           + (f"; kept in float32: {kept}" if kept else ""),
                           {"precision": "bf16", "convs": m.convs, "matmuls": m.matmuls, "kept": dict(m.kept)})
