"""ALT's layout primitives: a tensor's layout is an ordered sequence of split / reorder / fuse /
pad / unfold applied to its logical (ONNX) shape.

Each primitive maps a shape to a new shape and an access (index list) on the old shape to the
access on the new one (ALT Table 1 and Eq. 1). Basic primitives (split, reorder, fuse) and pad are
invertible, so a sequence of them is a bijection (pad: an injection) and becomes a TVM IndexMap for
`relax.op.layout_transform`; unfold duplicates data (overlapped tiles) and has no IndexMap: it
needs a producer stage. `apply_np` / `invert_np` pack and unpack arrays (weights at build time,
test oracles). Dimensions are 0-based here (the paper's are 1-based).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Sequence, Union

import numpy as np
from tvm import tirx

Index = Sequence  # of ints or PrimExprs


@dataclass(frozen=True)
class Split:
    """Dimension `dim` of size F1*...*Fm becomes m dimensions of sizes F1..Fm (outer first)."""

    dim: int
    factors: tuple[int, ...]

    def shape(self, s: tuple[int, ...]) -> tuple[int, ...]:
        if prod(self.factors) != s[self.dim]:
            raise ValueError(f"split of dim {self.dim} (size {s[self.dim]}) by {self.factors}: factors must multiply "
                             "to the size (pad first)")
        return s[:self.dim] + tuple(self.factors) + s[self.dim + 1:]

    def fwd(self, idx: Index, s: tuple[int, ...]) -> list:
        i = idx[self.dim]
        parts = []
        for j, f in enumerate(self.factors):
            inner = prod(self.factors[j + 1:])
            q = i // inner if inner > 1 else i
            parts.append(q % f if j > 0 else q)
        return list(idx[:self.dim]) + parts + list(idx[self.dim + 1:])

    def inv(self, idx: Index, s: tuple[int, ...]) -> list:
        m = len(self.factors)
        i = 0
        for j in range(m):
            i = i * self.factors[j] + idx[self.dim + j]
        return list(idx[:self.dim]) + [i] + list(idx[self.dim + m:])


@dataclass(frozen=True)
class Reorder:
    """New dimension k is old dimension perm[k]."""

    perm: tuple[int, ...]

    def shape(self, s: tuple[int, ...]) -> tuple[int, ...]:
        if sorted(self.perm) != list(range(len(s))):
            raise ValueError(f"reorder {self.perm} is not a permutation of {len(s)} dimensions")
        return tuple(s[p] for p in self.perm)

    def fwd(self, idx: Index, s: tuple[int, ...]) -> list:
        return [idx[p] for p in self.perm]

    def inv(self, idx: Index, s: tuple[int, ...]) -> list:
        out = [None] * len(self.perm)
        for k, p in enumerate(self.perm):
            out[p] = idx[k]
        return out


@dataclass(frozen=True)
class Fuse:
    """Consecutive dimensions dims[0]..dims[-1] become one (row-major)."""

    dims: tuple[int, ...]

    def shape(self, s: tuple[int, ...]) -> tuple[int, ...]:
        a, b = self.dims[0], self.dims[-1]
        if list(self.dims) != list(range(a, b + 1)):
            raise ValueError(f"fuse {self.dims}: dimensions must be consecutive")
        return s[:a] + (prod(s[a:b + 1]),) + s[b + 1:]

    def fwd(self, idx: Index, s: tuple[int, ...]) -> list:
        a, b = self.dims[0], self.dims[-1]
        e = 0
        for k in range(a, b + 1):
            e = e * s[k] + idx[k]
        return list(idx[:a]) + [e] + list(idx[b + 1:])

    def inv(self, idx: Index, s: tuple[int, ...]) -> list:
        a, b = self.dims[0], self.dims[-1]
        return Split(a, tuple(s[a:b + 1])).fwd(idx, self.shape(s))


@dataclass(frozen=True)
class Pad:
    """Dimension `dim` grows to `size` with zeros at the end (alignment, bank conflicts)."""

    dim: int
    size: int

    def shape(self, s: tuple[int, ...]) -> tuple[int, ...]:
        if self.size < s[self.dim]:
            raise ValueError(f"pad of dim {self.dim} to {self.size} < its size {s[self.dim]}")
        return s[:self.dim] + (self.size,) + s[self.dim + 1:]

    def fwd(self, idx: Index, s: tuple[int, ...]) -> list:
        return list(idx)

    def inv(self, idx: Index, s: tuple[int, ...]) -> list:
        return list(idx)


@dataclass(frozen=True)
class Unfold:
    """Overlapped tiling: dimension `dim` of size D becomes (ceil((D - tile) / stride) + 1, tile);
    tile j holds elements j*stride .. j*stride + tile - 1 (ALT §4.1). Not a bijection."""

    dim: int
    tile: int
    stride: int

    def shape(self, s: tuple[int, ...]) -> tuple[int, ...]:
        d = s[self.dim]
        n = -(-(d - self.tile) // self.stride) + 1
        return s[:self.dim] + (n, self.tile) + s[self.dim + 1:]

    def window_access(self, i, r, conv_stride: int, window: int) -> tuple:
        """ALT Eq. 1: the element T[V*i + r] of a sliding-window read (window index i, offset r
        < window M, conv stride V) in the unfolded tensor: (tile, offset within the tile)."""
        per_tile = (self.tile - window) // conv_stride + 1
        t = i // per_tile
        return t, conv_stride * i + r - self.stride * t

    def fwd(self, idx: Index, s: tuple[int, ...]) -> list:
        raise ValueError("unfold duplicates elements: an access has several images; use window_access")

    def inv(self, idx: Index, s: tuple[int, ...]) -> list:
        i = idx[self.dim] * self.stride + idx[self.dim + 1]
        return list(idx[:self.dim]) + [i] + list(idx[self.dim + 2:])


Primitive = Union[Split, Reorder, Fuse, Pad, Unfold]


@dataclass(frozen=True)
class LayoutSeq:
    """The layout of one tensor: primitives applied in order to its logical shape."""

    logical: tuple[int, ...]
    prims: tuple[Primitive, ...] = ()

    def shapes(self) -> list[tuple[int, ...]]:
        out = [tuple(self.logical)]
        for p in self.prims:
            out.append(p.shape(out[-1]))
        return out

    def shape(self) -> tuple[int, ...]:
        return self.shapes()[-1]

    @property
    def is_identity(self) -> bool:
        return not self.prims

    @property
    def is_bijective(self) -> bool:
        """Basic primitives only: may be propagated (ALT Constraint 2) and has an IndexMap."""
        return all(isinstance(p, (Split, Reorder, Fuse)) for p in self.prims)

    def fwd(self, idx: Index) -> list:
        """Logical access -> storage access."""
        shapes = self.shapes()
        idx = list(idx)
        for p, s in zip(self.prims, shapes):
            idx = p.fwd(idx, s)
        return idx

    def inv(self, idx: Index) -> list:
        """Storage access -> logical access."""
        shapes = self.shapes()
        idx = list(idx)
        for p, s in reversed(list(zip(self.prims, shapes))):
            idx = p.inv(idx, s)
        return idx

    def index_map(self) -> tirx.IndexMap:
        if not all(isinstance(p, (Split, Reorder, Fuse, Pad)) for p in self.prims):
            raise ValueError("unfold has no index map: materialize it with a producer stage")
        return tirx.IndexMap.from_func(lambda *i: self.fwd(i), ndim=len(self.logical))

    def apply_np(self, a: np.ndarray) -> np.ndarray:
        """Pack a logical array into this layout (zeros where padded). Without unfold each
        primitive is a numpy view or copy (reshape, transpose, zero pad): packing GPT-2's weights
        by an index gather took 4.9 s of a 28 s warm rebuild."""
        if a.shape != tuple(self.logical):
            raise ValueError(f"array of shape {a.shape}, layout of {self.logical}")
        if any(isinstance(p, Unfold) for p in self.prims):
            return self.gather_np(a)
        for p, s in zip(self.prims, self.shapes()):
            if isinstance(p, Reorder):
                a = a.transpose(p.perm)
            elif isinstance(p, Pad):
                a = np.pad(a, [(0, p.size - n if k == p.dim else 0) for k, n in enumerate(s)])
            else:                                       # split, fuse: row-major regrouping
                a = a.reshape(p.shape(s))
        return np.ascontiguousarray(a)

    def gather_np(self, a: np.ndarray) -> np.ndarray:
        """apply_np by the definition: every storage element reads the logical element inv() names
        (any primitive; the oracle the fast path is tested against)."""
        out = np.zeros(self.shape(), a.dtype)
        grid = np.indices(out.shape).reshape(len(out.shape), -1)
        src = self.inv(list(grid))
        valid = np.all([s < n for s, n in zip(src, self.logical)], axis=0)
        out.reshape(-1)[valid] = a[tuple(s[valid] for s in src)]
        return out

    def invert_np(self, packed: np.ndarray) -> np.ndarray:
        """Logical array read back from this layout (any element, for unfold the first copy)."""
        grid = np.indices(self.logical).reshape(len(self.logical), -1)
        if any(isinstance(p, Unfold) for p in self.prims):
            src = _unfold_gather(self, grid)
        else:
            src = self.fwd(list(grid))
        return packed[tuple(src)].reshape(self.logical)

    def describe(self) -> str:
        return " ".join(_describe(p) for p in self.prims) or "identity"


def _unfold_gather(seq: LayoutSeq, grid) -> list:
    idx = list(grid)
    for p, s in zip(seq.prims, seq.shapes()):
        if isinstance(p, Unfold):
            i = idx[p.dim]
            n_tiles = p.shape(s)[p.dim]
            t = np.minimum(i // p.stride, n_tiles - 1)
            idx = idx[:p.dim] + [t, i - t * p.stride] + idx[p.dim + 1:]
        else:
            idx = p.fwd(idx, s)
    return idx


def _describe(p: Primitive) -> str:
    if isinstance(p, Split):
        return f"split({p.dim}, {list(p.factors)})"
    if isinstance(p, Reorder):
        return f"reorder({list(p.perm)})"
    if isinstance(p, Fuse):
        return f"fuse({list(p.dims)})"
    if isinstance(p, Pad):
        return f"pad({p.dim}, {p.size})"
    return f"unfold({p.dim}, tile={p.tile}, stride={p.stride})"


def channel_blocked(shape: tuple[int, ...], channel_dim: int, block: int) -> LayoutSeq:
    """N C H W -> N (C/b) H W b: split the channel dimension, move the block innermost."""
    if block == 1:
        return LayoutSeq(tuple(shape))
    c = shape[channel_dim]
    rank = len(shape) + 1
    perm = tuple(k for k in range(rank) if k != channel_dim + 1) + (channel_dim + 1,)
    return LayoutSeq(tuple(shape), (Split(channel_dim, (c // block, block)), Reorder(perm)))


def conv_weight_blocked(shape: tuple[int, int, int, int], in_block: int, out_block: int) -> LayoutSeq:
    """O I KH KW -> (O/o) (I/i) KH KW i o: ALT's kernel template with o'_t = o, i'_t = i."""
    o, i = shape[0], shape[1]
    seq = (Split(0, (o // out_block, out_block)), Split(2, (i // in_block, in_block)),
           Reorder((0, 2, 4, 5, 3, 1)))
    return LayoutSeq(tuple(shape), seq)


def layout_name(axes: str, block: int, channel: str = "C") -> str:
    """Relax's layout string: NCHW with block 16 -> NCHW16c."""
    return axes if block == 1 else f"{axes}{block}{channel.lower()}"

