"""The compute definitions of the int8 pass's integer kernels (int8.py) and their weights' packing:
panels of `lanes` output columns with k in groups of `group` innermost, a convolution's activation
laid out channels-last with its padding, and the int32 sums over them (the CPU int-dot rule
schedules these; AMX tiles take the same conv panels, int8_tiles.py)."""
from __future__ import annotations

from typing import Callable

import numpy as np
from tvm import te, tirx

PANEL = 8          # weight columns per panel: the int32 lanes of the CPU int-dot rule's pair vector


def padded(n: int, lanes: int) -> int:
    """n columns (output channels) rounded up to whole panels of `lanes`."""
    return n - n % -lanes


def pack_panels(w: np.ndarray, lanes: int = PANEL, group: int = 2) -> np.ndarray:
    """K x N int8 -> [ceil(N/lanes), K/group, lanes, group]: a panel's columns, k in groups
    innermost; the last panel's missing columns are zero weights."""
    k, n = w.shape
    w = np.pad(w, [(0, 0), (0, padded(n, lanes) - n)])
    return np.ascontiguousarray(w.reshape(k // group, group, -1, lanes).transpose(2, 0, 3, 1))


def pack_conv(w: np.ndarray, lanes: int = PANEL, group: int = 2) -> np.ndarray:
    """OC x C x *K int8 (1-D or 2-D kernel) -> [ceil(OC/lanes), *K, CG, lanes, group], C zero-padded
    to group * CG and OC to whole panels."""
    oc, c, *k = w.shape
    w = np.pad(w, [(0, padded(oc, lanes) - oc), (0, -c % group)] + [(0, 0)] * len(k))
    oc = w.shape[0]
    order = (0, *range(4, 4 + len(k)), 2, 1, 3)
    return np.ascontiguousarray(w.reshape(oc // lanes, lanes, -1, group, *k).transpose(order))


def channels_last_pad(x: te.Tensor, before: list[int], after: list[int], group: int = 2, fill: int = 0,
                      convert: Callable[[tirx.PrimExpr], tirx.PrimExpr] | None = None, dtype: str = "") -> te.Tensor:
    """NC[H]W -> N[H]WC with C rounded up to a multiple of `group` and the spatial padding (before,
    after each spatial axis) as `fill` (the activation's zero), so a group of channels at one
    position is one contiguous load. `convert` maps each value on the way to `dtype` (the bf16 pass's
    rounding)."""
    n, c, *space = (int(d) for d in x.shape)
    convert = convert or (lambda v: v)

    def value(i, *pos):
        *where, ch = pos
        inside = [tirx.all(p >= lo, p < d + lo) for p, lo, d in zip(where, before, space)]
        kept = convert(x[(i, tirx.min(ch, c - 1), *(p - lo for p, lo in zip(where, before)))])
        return te.if_then_else(tirx.all(*inside, ch < c), kept, tirx.const(fill, dtype or x.dtype))
    return te.compute((n, *(d + lo + hi for d, lo, hi in zip(space, before, after)), c - c % -group), value,
                      name="channels_last_pad")


def padded_rows(x: te.Tensor, width: int, rows: int, fill: int = 0, dtype: str = "",
                convert: Callable[[tirx.PrimExpr], tirx.PrimExpr] | None = None, name: str = "rows") -> te.Tensor:
    """[M, K] -> [1, 1, rows, width]: a matmul's rows as a TileDot's channels-last input, K filled to
    `width` and M to `rows` with `fill`; `convert` maps each value on the way to `dtype` (bf16)."""
    m, k = (int(d) for d in x.shape)
    convert = convert or (lambda v: v)
    return te.compute((1, 1, rows, width), lambda a, b, i, j: te.if_then_else(
        tirx.all(i < m, j < k), convert(x[tirx.min(i, m - 1), tirx.min(j, k - 1)]), tirx.const(fill, dtype or x.dtype)),
        name=name)


def int_conv(xp: te.Tensor, panels: te.Tensor, out_space: list[int], strides: list[int],
             dilation: list[int], channels: int | None = None) -> te.Tensor:
    """C[n, o, *pos] = sum over (kernel taps, channel groups) of int32(xp) * int32(W): NC[H]W
    int32 out of an N[H]WC input and [O/L, *K, C/G, L, G] panels (1-D or 2-D). With `channels`
    fewer than the panels' columns, the sums cover whole panels and the first `channels` are the
    result (the int-dot rule keeps the padded tile in registers and writes only these)."""
    *taps, cg = (int(d) for d in panels.shape[1:-2])
    lanes, group = (int(d) for d in panels.shape[-2:])
    k = [te.reduce_axis((0, t), name=f"k{i}") for i, t in enumerate(taps)]
    ko, ki = te.reduce_axis((0, cg), name="ko"), te.reduce_axis((0, group), name="ki")

    def value(i, o, *pos):
        at = [p * s + t * d for p, s, t, d in zip(pos, strides, k, dilation)]
        return te.sum(xp[(i, *at, group * ko + ki)].astype("int32")
                      * panels[(o // lanes, *k, ko, o % lanes, ki)].astype("int32"), axis=[*k, ko, ki])
    acc = te.compute((xp.shape[0], int(panels.shape[0]) * lanes, *out_space), value, name=f"conv{len(taps)}d_int8")
    return _first(acc, 1, channels)


def int_matmul(a: te.Tensor, panels: te.Tensor, columns: int | None = None) -> te.Tensor:
    """C[..., m, n] = sum over k groups of int32(A[..., m, k]) * int32(W[k, n]), W in [N/L, K/G, L, G]
    panels; the first `columns` of them where the last panel is padded (int_conv's `channels`)."""
    lanes, group = (int(d) for d in panels.shape[-2:])
    kdim, n = int(a.shape[-1]), int(panels.shape[0]) * lanes
    ko, ki = te.reduce_axis((0, kdim // group), name="ko"), te.reduce_axis((0, group), name="ki")
    acc = te.compute((*a.shape[:-1], n), lambda *i: te.sum(
        a[(*i[:-1], group * ko + ki)].astype("int32")
        * panels[i[-1] // lanes, ko, i[-1] % lanes, ki].astype("int32"), axis=[ko, ki]), name="matmul_int8")
    return _first(acc, acc.ndim - 1, columns)


def _first(acc: te.Tensor, axis: int, count: int | None) -> te.Tensor:
    """acc's first `count` indices along `axis` (acc itself when that is all of them)."""
    if count is None or count == int(acc.shape[axis]):
        return acc
    shape = [*acc.shape[:axis], count, *acc.shape[axis + 1:]]
    return te.compute(shape, lambda *i: acc[i], name=f"{acc.op.name}_columns")
