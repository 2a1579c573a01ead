"""Winograd F(m x m, 3 x 3) over channel-blocked layouts as three computes (Lavin & Gray, 2016):

    V[e, p, c]  = (B^T d_p B)[e]        per input tile p (alpha x alpha, alpha = m + 2) and channel
    M[e, p, k]  = sum_c V[e, p, c] U[e, c, k]                     alpha^2 GEMMs (the graph's matmul)
    Y[n, k, y, x] = (A^T M_p A)[y % m, x % m]                     per output tile, m x m positions

U = G g G^T is the weight transformed once at build time (numpy). The transform matrices are
TVM's (topi's Cook-Toom construction, the points its own Winograd convs use). A 3x3 stride-1
conv does 9 multiply-adds per output and channel; the GEMMs do alpha^2 / m^2 of them (4 for
F(2x2), 2.25 for F(4x4)), the transforms a few adds per element. Rows and columns that do not
fill a last tile are computed on zeros and not stored.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import te, tirx, topi
from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

from ..layout.conv import bounded_simplifier
from ..schedule.contract import WINOGRAD_ATTR as ATTR, WINOGRAD_TILE as TILE

KERNEL = 3


def matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A: alpha x m, B: alpha x alpha, G: alpha x 3) of F(m x m, 3 x 3), float64."""
    a, b, g = _cook_toom_convolution(_interpolation_points(m + KERNEL - 1), m, KERNEL)
    return np.asarray(a, np.float64), np.asarray(b, np.float64), np.asarray(g, np.float64)


@dataclass(frozen=True)
class Geometry:
    """One conv's Winograd shape: batch, channels, input and output map, padding, tile side m."""

    n: int
    channels: int
    out_channels: int
    h: int
    w: int
    oh: int
    ow: int
    pad_top: int
    pad_left: int
    m: int

    @property
    def alpha(self) -> int:
        return self.m + KERNEL - 1

    @property
    def tiles_h(self) -> int:
        return -(-self.oh // self.m)

    @property
    def tiles_w(self) -> int:
        return -(-self.ow // self.m)

    @property
    def tiles(self) -> int:
        return self.n * self.tiles_h * self.tiles_w

    def gemm_shapes(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(V, U) shapes of the batched GEMM."""
        e = self.alpha * self.alpha
        return (e, self.tiles, self.channels), (e, self.channels, self.out_channels)


def weight_transform(weight: np.ndarray, m: int) -> np.ndarray:
    """OIHW 3x3 weights -> U[alpha^2, C, K] float32 (G g G^T per output and input channel)."""
    _, _, g = matrices(m)
    u = np.einsum("ai,kcij,bj->abck", g, weight.astype(np.float64), g)
    alpha = g.shape[0]
    return np.ascontiguousarray(u.reshape(alpha * alpha, weight.shape[1], weight.shape[0]), dtype=np.float32)


def _coefficients(matrix: np.ndarray, name: str) -> te.Tensor:
    return topi.utils.const_matrix(matrix.astype(np.float32), name)


def input_transform(data: te.Tensor, g: Geometry) -> te.Tensor:
    """data [N, C/b, H, W, b] (NCHW{b}c) -> V [alpha^2, tiles, C]; positions outside the map
    (the conv's padding, a last tile's overhang) read as zeros."""
    block = int(data.shape[4])
    _, b, _ = matrices(g.m)
    coef = _coefficients(b, "winograd_B")
    alpha, per_image = g.alpha, g.tiles_h * g.tiles_w
    i = te.reduce_axis((0, alpha), "i")
    j = te.reduce_axis((0, alpha), "j")

    def body(e, p, c):
        s = bounded_simplifier([(c, g.channels)])
        y = (p % per_image) // g.tiles_w * g.m + i - g.pad_top
        x = p % g.tiles_w * g.m + j - g.pad_left
        inside = tirx.all(y >= 0, y < g.h, x >= 0, x < g.w)
        value = data[p // per_image, s(c // block), tirx.max(tirx.min(y, g.h - 1), 0),
                     tirx.max(tirx.min(x, g.w - 1), 0), s(c % block)]
        return te.sum(coef[i, e // alpha] * coef[j, e % alpha]
                      * tirx.if_then_else(inside, value, tirx.const(0.0, data.dtype)), axis=[i, j])

    return te.compute((alpha * alpha, g.tiles, g.channels), body, name="winograd_input",
                      attrs={ATTR: "input", TILE: g.m})


def batched_gemm(v: te.Tensor, u: te.Tensor) -> te.Tensor:
    """M[e, p, k] = sum_c V[e, p, c] U[e, c, k] (what the graph's matmul legalizes to)."""
    c = te.reduce_axis((0, int(v.shape[2])), "c")
    return te.compute((int(v.shape[0]), int(v.shape[1]), int(u.shape[2])),
                      lambda e, p, k: te.sum(v[e, p, c] * u[e, c, k], axis=c), name="winograd_gemm")


def output_transform(mm: te.Tensor, g: Geometry, out_block: int) -> te.Tensor:
    """M [alpha^2, tiles, K] -> Y [N, K/o, OH, OW, o] (NCHW{o}c)."""
    a_mat, _, _ = matrices(g.m)
    coef = _coefficients(a_mat, "winograd_A")
    alpha, per_image = g.alpha, g.tiles_h * g.tiles_w
    a = te.reduce_axis((0, alpha), "a")
    b = te.reduce_axis((0, alpha), "b")

    def body(n, kb, y, x, ko):
        p = n * per_image + y // g.m * g.tiles_w + x // g.m
        return te.sum(coef[a, y % g.m] * coef[b, x % g.m] * mm[a * alpha + b, p, kb * out_block + ko], axis=[a, b])

    return te.compute((g.n, g.out_channels // out_block, g.oh, g.ow, out_block), body, name="winograd_output",
                      attrs={ATTR: "output", TILE: g.m})
