"""Canonical expressions of the operators derive starts from (EinNet Table 2, NCHW as ONNX
writes them): what the frontend turns a legalized graph's convs and matmuls into.

Padding is not a separate step: a read outside the input is the input's padding (0), so a
padded, strided, dilated, grouped conv is one scope. ConvTranspose is written gather-free,
summing over input positions and reading the kernel at the offset that lands on the output
(reads outside the kernel are its zero padding), so it needs no divisibility guard.
"""
from __future__ import annotations

from .expr import Index, Iter, Scope, Tensor, mul, read, scope


def matmul(m: int, k: int, n: int, a: str = "A", b: str = "B") -> Scope:
    """C[m, n] = Sum_k A[m, k] * B[k, n]."""
    A, B = Tensor(a, (m, k)), Tensor(b, (k, n))
    return scope([Iter("m", 0, m), Iter("n", 0, n)], [Iter("k", 0, k)], mul(read(A, "m", "k"), read(B, "k", "n")))


def batch_matmul(b: int, m: int, k: int, n: int, a: str = "A", bname: str = "B") -> Scope:
    A, B = Tensor(a, (b, m, k)), Tensor(bname, (b, k, n))
    return scope([Iter("b", 0, b), Iter("m", 0, m), Iter("n", 0, n)], [Iter("k", 0, k)],
                 mul(read(A, "b", "m", "k"), read(B, "b", "k", "n")))


def conv_out(size: int, kernel: int, stride: int, pad: tuple[int, int], dilation: int) -> int:
    return (size + pad[0] + pad[1] - dilation * (kernel - 1) - 1) // stride + 1


def conv2d(data: tuple[int, int, int, int], weight: tuple[int, int, int, int], strides=(1, 1),
           pads=(0, 0, 0, 0), dilations=(1, 1), group: int = 1, x: str = "X", w: str = "W") -> Scope:
    """ONNX Conv (NCHW data, OIHW weight, pads = (top, left, bottom, right)):
    Y[n, f, h, w] = Sum_{c, r, s} X[n, (f // Fg) * Cg + c, h*sh + r*dh - pt, w*sw + s*dw - pl] * W[f, c, r, s]."""
    n, _, hi, wi = data
    f, cg, kh, kw = weight
    fg = f // group
    ho = conv_out(hi, kh, strides[0], (pads[0], pads[2]), dilations[0])
    wo = conv_out(wi, kw, strides[1], (pads[1], pads[3]), dilations[1])
    X, W = Tensor(x, tuple(data)), Tensor(w, tuple(weight))
    c_in = Index.of("c") + (Index.of("f") // fg) * cg if group > 1 else Index.of("c")
    body = mul(read(X, "n", c_in, Index.of("h") * strides[0] + Index.of("r") * dilations[0] - pads[0],
                    Index.of("w") * strides[1] + Index.of("s") * dilations[1] - pads[1]),
               read(W, "f", "c", "r", "s"))
    return scope([Iter("n", 0, n), Iter("f", 0, f), Iter("h", 0, ho), Iter("w", 0, wo)],
                 [Iter("c", 0, cg), Iter("r", 0, kh), Iter("s", 0, kw)], body)


def conv_transpose2d(data: tuple[int, int, int, int], weight: tuple[int, int, int, int], strides=(1, 1),
                     pads=(0, 0, 0, 0), x: str = "X", w: str = "W") -> Scope:
    """ONNX ConvTranspose (group 1, dilation 1; weight C x F x R x S):
    Y[n, f, h, w] = Sum_{c, i, j} X[n, c, i, j] * W[c, f, h + pt - i*sh, w + pl - j*sw]."""
    n, c, hi, wi = data
    _, f, kh, kw = weight
    ho = (hi - 1) * strides[0] - pads[0] - pads[2] + kh
    wo = (wi - 1) * strides[1] - pads[1] - pads[3] + kw
    X, W = Tensor(x, tuple(data)), Tensor(w, tuple(weight))
    body = mul(read(X, "n", "c", "i", "j"),
               read(W, "c", "f", Index.of("h") + pads[0] - Index.of("i") * strides[0],
                    Index.of("w") + pads[1] - Index.of("j") * strides[1]))
    return scope([Iter("n", 0, n), Iter("f", 0, f), Iter("h", 0, ho), Iter("w", 0, wo)],
                 [Iter("c", 0, c), Iter("i", 0, hi), Iter("j", 0, wi)], body)
