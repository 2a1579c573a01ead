"""CPU schedules for Winograd convolution's transform kernels (optimize/winograd: the input
transform V = B^T d B per tile and channel, the output transform Y = A^T M A per tile and
output channel, with the conv's epilogue). Between them runs a batched GEMM that Gensor takes.

Each transform is a reduction over the alpha x alpha tile with constant coefficients: fully
unrolled, TVM's simplifier folds the coefficients (zeros vanish, ones become adds), so a tile
costs the transform's few adds per element instead of alpha^2 multiplies. The channel block is
the vector; tiles run in parallel. The transform blocks carry ATTR (their stage) and TILE (m).
"""
from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx

from ..tir_util import Anchor, KernelSchedule, RuleMismatch, loop_extent

ATTR = "packager.winograd"          # block annotation: "input" | "output"
TILE = "packager.winograd_tile"     # block annotation: m, the output tile's side


def stage(func: tirx.PrimFunc) -> tuple[str, int] | None:
    """(stage, m) of a Winograd transform kernel, None for any other kernel."""
    found: list = []

    def visit(block) -> None:
        if ATTR in block.annotations:
            found.append((str(block.annotations[ATTR]), int(block.annotations[TILE])))

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, visit), order="pre")
    return found[0] if found else None


def _block(sch: s_tir.Schedule, kind: str) -> tuple[object, list]:
    """The transform block, its coefficient matrices inlined; and the blocks after it (the epilogue)."""
    blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    for pos, b in enumerate(blocks):
        ann = sch.get(b).annotations
        if ATTR in ann and str(ann[ATTR]) == kind:
            for producer in blocks[:pos]:
                sch.compute_inline(producer)
            return b, blocks[pos + 1:]
    raise RuleMismatch(f"no Winograd {kind} block")


def _input(sch: s_tir.Schedule, lanes: int) -> KernelSchedule:
    """V[e, p, c]: per tile p and channel block, the alpha^2 outputs of one channel vector."""
    blk, after = _block(sch, "input")
    if after:
        raise RuleMismatch("an input transform has no epilogue")
    e, p, c, i, j = sch.get_loops(blk)
    block = min(loop_extent(sch, c), lanes)
    cb, ci = sch.split(c, [None, block])
    sch.reorder(p, cb, e, i, j, ci)
    local = sch.cache_write(blk, 0, "local")
    sch.reverse_compute_at(local, cb)
    tiles = loop_extent(sch, p)
    if tiles > 1:
        sch.parallel(p)
    for lp in (e, i, j):
        sch.unroll(lp)
    sch.vectorize(ci)
    init = sch.get_loops(sch.decompose_reduction(blk, e))
    for lp in init[2:-1]:
        sch.unroll(lp)
    sch.vectorize(init[-1])
    wb = sch.get_loops(local)
    for lp in wb[2:-1]:
        sch.unroll(lp)
    sch.vectorize(wb[-1])
    return KernelSchedule("winograd-input", parallel=tiles, vector=block, register_tile=loop_extent(sch, e))


def _output(sch: s_tir.Schedule, rules, m: int) -> KernelSchedule:
    """Y[n, kb, y, x, ko]: per tile (m x m positions) and output-channel block, accumulated in
    registers from the alpha^2 GEMM results, the epilogue applied on the way out."""
    blk, after = _block(sch, "output")
    anchor = Anchor(blk, [], after, [], [], None, None, {}, rules.lanes(32))
    n, kb, y, x, ko, a, b = sch.get_loops(blk)
    th, vh = sch.split(y, [None, m])
    tw, vw = sch.split(x, [None, m])
    sch.reorder(n, th, tw, kb, a, b, vh, vw, ko)
    tiles = sch.fuse(n, th, tw)
    count = loop_extent(sch, tiles)
    if count > 1:
        sch.parallel(tiles)
    rules.finish_anchor(sch, anchor, kb, ko, [a, b, vh, vw], init_depth=2)
    return KernelSchedule("winograd-output", parallel=count, vector=loop_extent(sch, ko), register_tile=m * m)


def cpu(rules, func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, KernelSchedule]:
    """The transform kernel `func` scheduled (raises RuleMismatch for other kernels)."""
    found = stage(func)
    if found is None:
        raise RuleMismatch("not a Winograd transform")
    kind, m = found
    sch = s_tir.Schedule(func)
    info = _input(sch, rules.lanes(32)) if kind == "input" else _output(sch, rules, m)
    return sch.mod["main"], info
