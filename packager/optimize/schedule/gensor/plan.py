"""A tile plan: what the construction-based scheduler decides for one kernel's anchor block.

The anchor is the kernel's single reduction block (conv, matmul, pooling). Its iterators keep
the block's order; each gets one tile size per memory level, outer level first:

* CPU levels ``("L2", "L1", "reg")``: a spatial iterator's L2 tile is the work of one parallel
  task, its L1 tile the part whose operands stay in L1, its register tile the micro-kernel
  (the vector iterator's register tile is a multiple of the vector lanes). A reduction
  iterator has its full extent at L2, its chunk at L1 (operands of one chunk stay in L1), and
  1 in registers.
* GPU levels ``("block", "thread")``: a spatial iterator's block tile (staged in shared
  memory, one CUDA block) and thread tile (registers of one thread); ``vthreads[d]`` splits
  the thread tile into interleaved virtual threads. A reduction iterator has its shared-memory
  chunk at "block" and 1 at "thread".

Every tile divides the tile above it (and the extent), so the schedule needs no predicates.
``order`` (CPU) places the reduction chunk loop outside the L1 tiles (``chunks-outer``: a
chunk's operands are reused by every L1 tile of the task) or inside them (``chunks-inner``: an L1
tile's accumulators are finished before the next); the measured tuner searches it. ``pad`` (CPU,
kernels with a padding stage) computes the padded input once for the whole kernel (``staged``),
per parallel task, only the region that task reads (``per-task``), or not at all: each read tests
its bounds (``inline``): see padding.py.
"""
from __future__ import annotations

from dataclasses import dataclass

SPATIAL, REDUCE = "S", "R"
ORDERS = ("chunks-outer", "chunks-inner")
PADS = ("staged", "per-task", "inline")
CPU_LEVELS = ("L2", "L1", "reg")
GPU_LEVELS = ("block", "thread")


@dataclass(frozen=True)
class TilePlan:
    axes: tuple[str, ...]                     # anchor block iterator names, block order
    kinds: tuple[str, ...]                    # SPATIAL | REDUCE per iterator
    extents: tuple[int, ...]
    tiles: tuple[tuple[int, ...], ...]        # tiles[d][k], outer level first
    levels: tuple[str, ...]
    vthreads: tuple[int, ...] = ()            # GPU: virtual threads per iterator (1 = none)
    vector_axis: int = -1                     # CPU: index of the vectorized iterator (-1: none)
    order: str = ORDERS[0]                    # CPU: where the reduction chunk loop sits (ORDERS)
    pad: str = PADS[0]                        # CPU: where a padding stage is computed (PADS)

    def gpu_threads(self) -> int:
        """Threads per CUDA block: block tile over thread tile, over the spatial iterators."""
        n = 1
        for d, kind in enumerate(self.kinds):
            if kind == SPATIAL:
                n *= self.tile(d, "block") // self.tile(d, "thread")
        return n

    def tile(self, d: int, level: str) -> int:
        return self.tiles[d][self.levels.index(level)]

    def vthread(self, d: int) -> int:
        return self.vthreads[d] if self.vthreads else 1

    def check(self) -> None:
        """Raise ValueError unless every tile divides its parent and the extent."""
        for d, (ext, ts) in enumerate(zip(self.extents, self.tiles)):
            parent = ext
            for t in ts:
                if t < 1 or parent % t:
                    raise ValueError(f"{self.axes[d]}: tile {t} does not divide {parent}")
                parent = t
            if self.vthreads and self.tiles[d][-1] % self.vthreads[d]:
                raise ValueError(f"{self.axes[d]}: {self.vthreads[d]} vthreads do not divide {self.tiles[d][-1]}")

    def describe(self) -> str:
        """One line for the build report, e.g. 'ff 64/16/8 yy 7/7/1 xx 8/8/8 | rc 512/64/1'."""
        sp = [f"{a} {'/'.join(map(str, t))}" + (f" v{self.vthread(d)}" if self.vthread(d) > 1 else "")
              for d, (a, k, t) in enumerate(zip(self.axes, self.kinds, self.tiles)) if k == SPATIAL and self.extents[d] > 1]
        rd = [f"{a} {'/'.join(map(str, t))}" for a, k, t, e in zip(self.axes, self.kinds, self.tiles, self.extents)
              if k == REDUCE and e > 1]
        return (" ".join(sp) + (" | " + " ".join(rd) if rd else "")
                + (f" ({self.order})" if self.order != ORDERS[0] else "")
                + (f" (pad {self.pad})" if self.pad != PADS[0] else ""))

    def as_dict(self) -> dict:
        return {"axes": list(self.axes), "kinds": list(self.kinds), "extents": list(self.extents),
                "tiles": [list(t) for t in self.tiles], "levels": list(self.levels),
                "vthreads": list(self.vthreads), "vector_axis": self.vector_axis, "order": self.order,
                "pad": self.pad}

    @staticmethod
    def from_dict(d: dict) -> "TilePlan":
        return TilePlan(tuple(d["axes"]), tuple(d["kinds"]), tuple(d["extents"]), tuple(tuple(t) for t in d["tiles"]),
                        tuple(d["levels"]), tuple(d.get("vthreads", ())), d.get("vector_axis", -1),
                        d.get("order", ORDERS[0]), d.get("pad", PADS[0]))
