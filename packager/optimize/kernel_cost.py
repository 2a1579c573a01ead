"""Work and compulsory traffic of a kernel, read from its (unscheduled) TIR.

FLOPs: for every block, the iteration-domain size times the floating-point arithmetic nodes in
the value it stores (a multiply-accumulate counts 2; exp, tanh, ... count 1; index arithmetic is
integer and not counted, but an integer reduction's multiply-accumulate, an int8 matmul's, counts
2); a kernel written as plain loops (a recurrent layer's time loop) counts
every store times the extents of the loops around it. Bytes: every parameter buffer read or
written once, the minimum traffic to memory (plus a write and a read of every tensor a phased
GPU kernel passes between its phases). Together they place a kernel on the roofline.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir import expr as ir

from .schedule.phases import phase_sizes, split_phases

ARITH = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Max, tirx.Min, tirx.Select)   # Select: ieee.py's max/min


@dataclass(frozen=True)
class KernelCost:
    flops: int
    bytes: int

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0


def float_ops(value) -> int:
    count = [0]

    def visit(node):
        ty = getattr(node, "ty", None)
        if str(getattr(ty, "dtype", "")).startswith(("float", "bfloat")):
            count[0] += 1

    tvm_ffi.structural_walk(value, ((*ARITH, ir.Call), visit), order="post")
    return count[0]


def kernel_cost(func: tirx.PrimFunc) -> KernelCost:
    flops = 0
    blocks: list = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, blocks.append), order="post")
    if not blocks:
        flops = _loop_flops(func.body)
    for blk in blocks:
        if not blk.iter_vars or not isinstance(blk.body, tirx.BufferStore):
            continue
        domain = 1
        for iv in blk.iter_vars:
            ext = iv.dom.extent
            if not isinstance(ext, tirx.IntImm):
                break
            domain *= int(ext)
        else:
            flops += domain * (2 if _integer_reduction(blk) else float_ops(blk.body.value))
    nbytes = sum(_nbytes(p) for p in func.params)
    sizes = phase_sizes(func)
    if sizes is not None:                 # a phased GPU kernel passes tensors on through memory
        nbytes += 2 * sum(_nbytes(b) for b in split_phases(func, sizes)[1])
    return KernelCost(flops, nbytes)


def _integer_reduction(blk) -> bool:
    return str(blk.body.buffer.dtype).startswith(("int", "uint")) and \
        any(iv.iter_type == tirx.IterVar.CommReduce for iv in blk.iter_vars)


def _loop_flops(stmt, times: int = 1) -> int:
    """FLOPs of the stores under `stmt`, each times the extents of the loops around it (a
    bounds check counts as taken)."""
    if isinstance(stmt, tirx.BufferStore):
        return times * float_ops(stmt.value)
    if isinstance(stmt, tirx.For):
        ext = stmt.extent
        return _loop_flops(stmt.body, times * (int(ext) if isinstance(ext, tirx.IntImm) else 1))
    if isinstance(stmt, tirx.SeqStmt):
        return sum(_loop_flops(s, times) for s in stmt.seq)
    if isinstance(stmt, tirx.IfThenElse):
        return _loop_flops(stmt.then_case, times) + (_loop_flops(stmt.else_case, times) if stmt.else_case else 0)
    body = getattr(stmt, "body", None)
    return _loop_flops(body, times) if isinstance(body, tirx.Stmt) else 0


def _nbytes(buf) -> int:
    shape = [int(d) for d in buf.shape]
    return int(np.prod(shape, dtype=np.int64)) * tvm.DataType(str(buf.dtype)).bits // 8
