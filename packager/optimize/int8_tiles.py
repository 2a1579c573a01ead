"""QDQ convs and matmuls on AMX-INT8 tiles (`tdpbusd`), for targets whose CPU has them (a named
Sapphire Rapids or later Xeon, or `mattr: ['+amx-tile', '+amx-int8']`).

The int8 pass (int8.py) takes this form first where it fits: the activation as uint8 (x_q, or an
int8 x_q offset by 128), laid out channels-last with its channels in whole 64-byte chunks and its
spatial padding and filling channels holding the zero point; the weights minus their zero point
as int8 panels [OC/16, KH, KW, C/4, 16, 4] (the filling channels zero weights); a u8s8 TileDot
kernel (schedule/rules/tile_dot.py: 16 x 16 x 64 products per instruction, int32 sums, exact)
writes the int32 sums NC[H]W (a matmul's rows as they are); the pass then subtracts the zero
point's share and scales, as for VNNI quads. Unlike the int-dot rule's kernels, the tile kernel
does not compute the epilogue: it is an element-wise kernel of its own.

It fits a conv2d (one group) or a constant-weight matmul whose output channels are whole panels
of 16, whose input channels are a multiple of 64 or at least 64 (padded up: fewer would multiply
mostly zeros), and whose rows of output positions have a divisor from 4 to 16 (a matmul's rows
are padded to 16 instead). Anything else takes the VNNI or pair forms.
"""
from __future__ import annotations

import numpy as np
from tvm import relax

from .int8_kernels import channels_last_pad, pack_conv, padded_rows
from .schedule.contract import TILE_KINDS, TILE_PANEL as PANEL, TileDot, reference_kernel, tile_channels, tile_unfit, \
    tiled_rows

KIND = "u8s8"
CHUNK = TILE_KINDS[KIND].chunk          # uint8 channels per 64-byte tile row


def unfit(c: int, out_channels: int, positions: int) -> str:
    """Why a conv or matmul does not take tiles ("" when it does)."""
    return tile_unfit(KIND, c, out_channels, positions)


def panels(w: np.ndarray, width: int) -> np.ndarray:
    """OC x C x KH x KW int8 -> [OC/16, KH, KW, width/4, 16, 4], C zero-filled to `width`."""
    return pack_conv(np.pad(w, [(0, 0), (0, width - w.shape[1]), (0, 0), (0, 0)]), PANEL, 4)


def conv(bb: relax.BlockBuilder, call: relax.Call, xi: relax.Expr, zp: int, w: np.ndarray) -> relax.Expr:
    """The conv2d's int32 sums NCHW, by a u8s8 TileDot over the channels-last activation."""
    a = call.attrs
    (n, c, h, wd), (oc, _, kh, kw) = (int(d) for d in xi.ty.shape.values), w.shape
    oh, ow = (int(d) for d in call.ty.shape.values[2:])
    pad, strides, dil = [int(p) for p in a.padding], [int(s) for s in a.strides], [int(d) for d in a.dilation]
    flat = (kh, kw) == (1, 1) and strides == [1, 1] and not any(pad)
    width = tile_channels(KIND, c)
    xp = bb.emit_te(channels_last_pad, xi, pad[:2], pad[2:], CHUNK, zp, primfunc_name_hint="channels_last_pad")
    g = TileDot(n, h + pad[0] + pad[2], wd + pad[1] + pad[3], width, oc, kh, kw,
                *((1, oh * ow) if flat else (oh, ow)), *strides, *dil, kind=KIND)
    out = _call(bb, g, xp, panels(w, width), (n, oc, oh * ow))
    return bb.emit(relax.op.reshape(out, (n, oc, oh, ow)))


def matmul(bb: relax.BlockBuilder, xi: relax.Expr, zp: int, w: np.ndarray) -> relax.Expr:
    """The matmul's int32 sums [..., N] of uint8 rows xi [..., K] and the K x N weight w."""
    shape = [int(d) for d in xi.ty.shape.values]
    k, n_out, m = shape[-1], w.shape[1], int(np.prod(shape[:-1]))
    width, mp = tile_channels(KIND, k), tiled_rows(m)
    rows = bb.emit_te(padded_rows, bb.emit(relax.op.reshape(xi, (m, k))), width, mp, zp, name="u8_rows",
                      primfunc_name_hint="u8_rows")
    g = TileDot(1, 1, mp, width, n_out, 1, 1, 1, mp, rows=True, kind=KIND)
    out = _call(bb, g, rows, panels(np.ascontiguousarray(w.T)[:, :, None, None], width), (mp, n_out))
    if mp != m:
        out = bb.emit(relax.op.strided_slice(out, axes=[0], begin=[0], end=[m]))
    return bb.emit(relax.op.reshape(out, (*shape[:-1], n_out)))


def _call(bb: relax.BlockBuilder, g: TileDot, x: relax.Expr, weights: np.ndarray, out: tuple) -> relax.Expr:
    gv = bb.add_func(reference_kernel(g), "tile_dot_int8")
    return bb.emit(relax.call_tir(gv, [x, relax.const(weights)], relax.TensorType(out, "int32")))
