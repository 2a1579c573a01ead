"""ALT's GEMM template for matmuls with constant weights: B (K x N) is stored as
(N/n_t) x K x n_t panels, packed at build time, so the vectorized n_t columns a tile needs are one
contiguous stream along k instead of K rows N floats apart (ALT Table 2: contiguous tiles cut L1
misses; the prefetcher follows them). A and C keep their row-major layouts: their consumers
(layer norm, softmax, reshapes) are not element-wise, so nothing propagates.

Where n_t does not divide N (language-model heads: GPT-2's 50257, BERT's 30522 words) the last
panel is zero-padded and the kernel computes all ceil(N/n_t)*n_t columns into its tile, storing
only the first N (a slice inside the same kernel, so no copy): the vector split stays whole.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, te

from ..relax_util import is_const, rewrite_functions

from .conv import bounded_simplifier
from .primitives import LayoutSeq, Reorder, Split


def padded(n: int, nt: int) -> int:
    """N rounded up to whole panels."""
    return -(-n // nt) * nt


def weight_panels(k: int, n: int, nt: int) -> LayoutSeq:
    """K N -> (N/n_t) K n_t: split N, move its outer part first (template with k_t = K); N a
    multiple of n_t (pad first)."""
    return LayoutSeq((k, n), (Split(1, (n // nt, nt)), Reorder((1, 0, 2))))


def pack_weight(w: np.ndarray, nt: int) -> np.ndarray:
    """B in panels, the last one zero-padded where n_t does not divide N."""
    k, n = w.shape
    if padded(n, nt) != n:
        w = np.concatenate([w, np.zeros((k, padded(n, nt) - n), w.dtype)], axis=1)
    return weight_panels(k, w.shape[1], nt).apply_np(w)


def matmul_packed(a: te.Tensor, b: te.Tensor, n: int, nt: int, out_dtype: str) -> te.Tensor:
    """C[..., m, j] = sum_k A[..., m, k] * B[j // n_t, k, j % n_t] with B in panels; over the padded
    width, then sliced to N in the same kernel where n_t does not divide N."""
    kdim, width = int(a.shape[-1]), padded(n, nt)
    k = te.reduce_axis((0, kdim), name="k")

    def body(*idx):
        *lead, j = idx
        s = bounded_simplifier([(j, width)])
        return te.sum(a[(*lead, k)].astype(out_dtype) * b[s(j // nt), k, s(j % nt)].astype(out_dtype), axis=k)

    c = te.compute((*a.shape[:-1], width), body, name="matmul_packed")
    if width == n:
        return c
    return te.compute((*a.shape[:-1], n), lambda *idx: c(*idx), name="matmul_packed_columns")


@dataclass(frozen=True)
class MatmulSite:
    """relax.matmul(A, B) with B a constant K x N matrix."""

    a: tuple[int, ...]
    n: int
    dtype: str

    @property
    def k(self) -> int:
        return self.a[-1]

    def kernel(self, nt: int):
        """The matmul alone with B row-major (nt = 0) or in n_t panels, as a PrimFunc."""
        a = te.placeholder(self.a, self.dtype, "a")
        if nt == 0:
            b = te.placeholder((self.k, self.n), self.dtype, "b")
            kk = te.reduce_axis((0, self.k), name="k")
            c = te.compute((*self.a[:-1], self.n), lambda *i: te.sum(a[(*i[:-1], kk)] * b[kk, i[-1]], axis=kk),
                           name="matmul")
        else:
            b = te.placeholder(weight_panels(self.k, padded(self.n, nt), nt).shape(), self.dtype, "b")
            c = matmul_packed(a, b, self.n, nt, self.dtype)
        return te.create_prim_func([a, b, c])

    def key(self) -> str:
        return f"matmul/{list(self.a)}/{self.n}/{self.dtype}"


def matmul_site(call) -> MatmulSite | None:
    """The site of a matmul whose B is a float constant matrix, else None."""
    if getattr(call.op, "name", None) != "relax.matmul" or not is_const(call.args[1]):
        return None
    a_ty, b_ty = call.args[0].ty, call.args[1].ty
    if getattr(b_ty, "ndim", 0) != 2 or getattr(a_ty, "ndim", 0) < 2 or a_ty.shape is None:
        return None
    if str(a_ty.dtype) != "float32" or str(b_ty.dtype) != "float32":
        return None
    a = tuple(int(d) for d in a_ty.shape)
    k, n = (int(d) for d in b_ty.shape)
    return MatmulSite(a, n, "float32") if a[-1] == k else None


@relax.expr_functor.mutator
class PackMatmulWeights(relax.PyExprMutator):
    """relax.matmul(A, B const) -> call_tir(matmul_packed, A, B packed at build time), for the
    matmuls given a panel width in `widths` (weight constant -> n_t)."""

    def __init__(self, mod: tvm.IRModule, widths: list[tuple[object, int]]):
        super().__init__(mod)
        self.widths = widths
        self.packed = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        site = matmul_site(call)
        nt = next((w for c, w in self.widths if site is not None and call.args[1].same_as(c)), 0)
        if not nt:
            return call
        self.packed += 1
        packed = relax.const(pack_weight(call.args[1].value.numpy(), nt))
        return self.builder_.call_te(lambda a, b: matmul_packed(a, b, site.n, nt, site.dtype), call.args[0], packed,
                                     primfunc_name_hint="matmul_packed")


def pack_matmul_weights(mod: tvm.IRModule, widths: list[tuple[object, int]]) -> tuple[tvm.IRModule, int]:
    m = PackMatmulWeights(mod, widths)
    return rewrite_functions(m, mod), m.packed
