"""What the cost model needs to know about a kernel's anchor block, read once from its TIR:
iterators (spatial/reduce, extents) and, per buffer it touches, how each index moves with each
iterator (an affine coefficient matrix). Footprints of any tile then cost a few multiplies,
so the Markov walk can score thousands of states per second.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from .plan import REDUCE, SPATIAL


@dataclass(frozen=True)
class Access:
    buffer: str
    shape: tuple[int, ...]
    elem_bytes: int
    coef: tuple[tuple[int, ...], ...]     # coef[buffer dim][iterator]; |index step| per iterator
    is_output: bool
    contiguous_axis: int                  # iterator with unit step in the last buffer dim (-1: none)

    def footprint(self, tile: list[int] | tuple[int, ...]) -> int:
        """Elements of this buffer one tile of the iteration space touches (conv halos included)."""
        n = 1
        for dim, row in zip(self.shape, self.coef):
            span = 1 + sum(c * (t - 1) for c, t in zip(row, tile) if c)
            n *= min(dim, span)
        return n

    def uses(self, axis: int) -> bool:
        return any(row[axis] for row in self.coef)


@dataclass(frozen=True)
class Workload:
    axes: tuple[str, ...]
    kinds: tuple[str, ...]
    extents: tuple[int, ...]
    accesses: tuple[Access, ...]          # inputs first, the output last
    flops_per_point: int                  # per point of the iteration space (MAC = 2)
    vector_axis: int                      # iterator of the output's innermost index (-1: none)
    key: str                              # stable identity of the kernel (tuning database key)
    pads: tuple[str, ...] = ("staged",)   # where its padding stage may be computed (plan.PADS, padding.py)

    @property
    def pad_choice(self) -> bool:
        """The padding stage may go elsewhere than one pass before the kernel."""
        return len(self.pads) > 1

    @property
    def preferred_pad(self) -> str:
        """The placement tried first beside staged: inline where offered, else per task."""
        return self.pads[-1]

    @property
    def inputs(self) -> tuple[Access, ...]:
        return tuple(a for a in self.accesses if not a.is_output)

    @property
    def output(self) -> Access:
        return self.accesses[-1]

    @property
    def points(self) -> int:
        n = 1
        for e in self.extents:
            n *= e
        return n

    def spatial(self) -> list[int]:
        return [d for d, k in enumerate(self.kinds) if k == SPATIAL]

    def reduce(self) -> list[int]:
        return [d for d, k in enumerate(self.kinds) if k == REDUCE]


def _vars(expr) -> set:
    found: set = set()
    tvm_ffi.structural_walk(expr, (tirx.Var, found.add), order="post")
    return found


def _coef_row(expr, iter_vars: list) -> tuple[int, ...]:
    """|step| of an index expression per iterator; non-affine uses (floordiv of grouped convs)
    count as step 1, an over-approximation of the footprint."""
    coef = tvm.sym.detect_linear_equation(expr, iter_vars)
    used = _vars(expr)
    if len(coef) == len(iter_vars) + 1 and all(isinstance(c, tirx.IntImm) for c in coef[:-1]):
        return tuple(abs(int(c)) for c in coef[:-1])
    return tuple(1 if v in used else 0 for v in iter_vars)


def _access(region, iter_vars: list, is_output: bool) -> Access:
    buf = region.source
    shape = tuple(int(d) for d in buf.shape)
    coef = tuple(_coef_row(r.min, iter_vars) for r in region.region)
    last = coef[-1] if coef else ()
    contiguous = next((d for d, c in enumerate(last) if c == 1), -1)
    return Access(buf.name, shape, max(buf.dtype.bits // 8, 1), coef, is_output, contiguous)


def _flops(block) -> int:
    from ...kernel_cost import float_ops
    body = block.body
    return max(float_ops(body.value), 1) if isinstance(body, tirx.BufferStore) else 1


def analyze(sch: s_tir.Schedule, anchor, func_key: str) -> Workload:
    """The workload of `anchor` (a reduction block whose iterators all have constant extents)."""
    blk = sch.get(anchor)
    ivs = list(blk.iter_vars)
    if any(not isinstance(iv.dom.extent, tirx.IntImm) or int(iv.dom.extent) < 1 for iv in ivs):
        raise ValueError("symbolic or empty extents")
    vars_ = [iv.var for iv in ivs]
    kinds = tuple(SPATIAL if iv.iter_type == tirx.IterVar.DataPar else REDUCE for iv in ivs)
    extents = tuple(int(iv.dom.extent) for iv in ivs)
    out = blk.writes[0]
    reads = [r for r in blk.reads if not r.source.same_as(out.source)]
    accesses = tuple([_access(r, vars_, False) for r in reads] + [_access(out, vars_, True)])
    vec = accesses[-1].contiguous_axis
    return Workload(tuple(iv.var.name for iv in ivs), kinds, extents, accesses, _flops(blk), vec, func_key)


def func_key(func: tirx.PrimFunc, target_key: str) -> str:
    """Workload key: the kernel's TIR text (names included: same model, same kernel) + target."""
    text = func.script()
    return hashlib.sha256(f"{target_key}\n{text}".encode()).hexdigest()[:24]
