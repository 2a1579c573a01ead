"""Souffle's global analysis on the kernel graph: every tensor expression (TE, a block of a
kernel) is classified one-relies-on-one (spatial only) or one-relies-on-many (it reduces),
layout-only (a plain copy) and compute- or memory-intensive by arithmetic intensity; tensors read
by several kernels are spatial reuse (independent readers: horizontal candidates) or temporal
reuse (one reader depends on the other)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from ..kernel_cost import float_ops
from .graph import KernelGraph

COMPUTE_INTENSIVE = 3.0      # FLOPs per byte (Souffle's threshold between CI and MI TEs)


@dataclass
class TESummary:
    tes: int = 0
    one_to_one: int = 0
    layout_only: int = 0
    one_to_many: int = 0
    compute_intensive: int = 0
    shared_spatial: int = 0
    shared_temporal: int = 0

    def line(self) -> str:
        return (f"{self.tes} TEs ({self.one_to_one} one-to-one [{self.layout_only} layout-only], "
                f"{self.one_to_many} one-to-many, {self.compute_intensive} compute-intensive); "
                f"{self.shared_spatial + self.shared_temporal} shared tensors ({self.shared_spatial} spatial, "
                f"{self.shared_temporal} temporal)")

    def as_dict(self) -> dict:
        return asdict(self)


def te_summary(g: KernelGraph) -> TESummary:
    s = TESummary()
    for c in g.calls.values():
        for blk in _blocks(c.prim):
            s.tes += 1
            if any(iv.iter_type == tirx.IterVar.CommReduce for iv in blk.iter_vars):
                s.one_to_many += 1
            else:
                s.one_to_one += 1
                s.layout_only += is_copy(blk)
            s.compute_intensive += intensity(blk) >= COMPUTE_INTENSIVE
    reach = reachability(g)
    for i, readers in g.consumers.items():
        calls = [r for r in readers if r in g.calls]
        if len(calls) < 2 or i not in g.calls:
            continue
        independent = all(not (reach[a] >> b & 1) and not (reach[b] >> a & 1)
                          for k, a in enumerate(calls) for b in calls[k + 1:])
        if independent:
            s.shared_spatial += 1
        else:
            s.shared_temporal += 1
    return s


def _blocks(func: tirx.PrimFunc) -> list:
    out: list = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, out.append), order="post")
    return [b for b in out if b.iter_vars and isinstance(b.body, tirx.BufferStore)]


def is_copy(blk) -> bool:
    """The block stores one plain load: a copy with an index map (a gather, whose indices load
    data, is not one)."""
    body = blk.body
    return isinstance(body, tirx.BufferStore) and _plain_load(body.value)


def is_conversion(blk) -> bool:
    """The block stores one plain load converted to another type (a cast between kernels that
    compute in different precisions, optimize/precision.py): a copy that changes the type."""
    body = blk.body
    return isinstance(body, tirx.BufferStore) and isinstance(body.value, tirx.Cast) and _plain_load(body.value.value)


def _plain_load(e) -> bool:
    """A load whose indices load nothing."""
    if not isinstance(e, TensorLoad):
        return False
    found: list = []
    for index in e.indices:
        tvm_ffi.structural_walk(index, (TensorLoad, found.append), order="post")
    return not found


def intensity(blk) -> float:
    """FLOPs of the block's domain over the bytes of the buffers it reads and writes (whole
    buffers: the compulsory traffic if nothing stays in cache)."""
    domain = 1
    for iv in blk.iter_vars:
        if not isinstance(iv.dom.extent, tirx.IntImm):
            return 0.0
        domain *= int(iv.dom.extent)
    flops = domain * float_ops(blk.body.value)
    nbytes = sum(_bytes(r.source) for r in list(blk.reads) + list(blk.writes))
    return flops / nbytes if nbytes else 0.0


def _bytes(buf) -> int:
    n = tvm.DataType(str(buf.dtype)).bits // 8
    for d in buf.shape:
        n *= int(d) if isinstance(d, tirx.IntImm) else 1
    return n


def reachability(g: KernelGraph) -> list[int]:
    """reach[i]: bitset of the bindings that depend on binding i (transitively)."""
    reach = [0] * len(g.bindings)
    for i in reversed(range(len(g.bindings))):
        for r in g.consumers[i]:
            reach[i] |= (1 << r) | reach[r]
    return reach
