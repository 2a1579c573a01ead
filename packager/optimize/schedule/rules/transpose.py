"""Transposed copies on the CPU: a copy whose output's innermost axis reads the input with a large
stride (K^T written straight from the QKV matmul's [tokens, 3 x hidden] rows, an NCHW <-> NHWC
relayout) walks a column of the input per vector. With a row stride that is a multiple of the
cache's set stride those columns fall into a few cache sets and thrash (measured 1.7x slower
than the same values copied twice through a contiguous buffer on BERT-base). Tiling both axes
(a lanes x vector tile: the tile's input rows are read once and stay in L1 while every output
row of the tile is written) keeps the column reads in cache.
"""
from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from ..tir_util import best_factor, loop_extent, vector_factor


def read_stride(block: tirx.SBlock, var: tirx.Var) -> int | None:
    """Elements between the block's one read at `var` and at `var + 1`, in the input's
    row-major order (None when the read is not affine in `var`)."""
    if len(block.reads) != 1:
        return None
    region = block.reads[0].region
    shape = block.reads[0].source.shape
    dtype = str(block.iter_vars[0].var.ty.dtype) if block.iter_vars else "int64"   # the index type
    flat = tirx.const(0, dtype)
    for rg, dim in zip(region, shape):
        flat = flat * tirx.const(int(dim), dtype) + rg.min
    ana = tvm.sym.Analyzer()
    for iv in block.iter_vars:
        ana.bind(iv.var, iv.dom)
    coef = tvm.sym.detect_linear_equation(ana.simplify(flat), [var])
    if len(coef) != 2 or not isinstance(coef[0], tirx.IntImm):
        return None
    return int(coef[0])


def tile_transposed_copy(sch: s_tir.Schedule, block, lanes: int, min_work: int) -> tuple[int, int] | None:
    """(parallel extent, vector lanes) after tiling a transposed copy, or None (not one: then
    the caller's flat schedule applies)."""
    blk = sch.get(block)
    loops = sch.get_loops(block)
    ivs = list(blk.iter_vars)
    if (len(loops) < 2 or len(loops) != len(ivs) or not isinstance(blk.body, tirx.BufferStore)
            or not isinstance(blk.body.value, TensorLoad)
            or any(loop_extent(sch, lp) != int(iv.dom.extent) for lp, iv in zip(loops, ivs))):
        return None
    inner = read_stride(blk, ivs[-1].var)
    if inner is None or abs(inner) < 2 * lanes:
        return None
    rows = [k for k, iv in enumerate(ivs[:-1]) if read_stride(blk, iv.var) == 1]
    if not rows:
        return None
    a, b = loops[rows[-1]], loops[-1]
    ta = best_factor(loop_extent(sch, a), lanes)
    tb = vector_factor(loop_extent(sch, b), lanes)
    if ta < 4 or tb < lanes:
        return None
    others = [lp for k, lp in enumerate(loops[:-1]) if k != rows[-1]]
    a_o, a_i = sch.split(a, [None, ta])
    b_o, b_i = sch.split(b, [None, tb])
    sch.reorder(*others, a_o, b_o, a_i, b_i)
    outer = sch.fuse(*others, a_o, b_o)
    sch.vectorize(b_i)
    n_outer = loop_extent(sch, outer)
    work = n_outer * ta * tb
    par = n_outer if work >= min_work and n_outer > 1 else 1
    if par > 1:
        sch.parallel(outer)
    return par, tb
