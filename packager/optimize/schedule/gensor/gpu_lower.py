"""Tile plan -> thread-bound CUDA schedule for one fused kernel (the GPU twin of the CPU
``tiled-reduction`` rule in ``cpu_schedule.py``).

The kernel holds producers (padding, copies), exactly one reduction anchor (conv, matmul,
pooling) and element-wise consumers. Each spatial anchor axis is split ``[ext/Tb, V, Tb/Tt,
Tt/V]`` and bound blockIdx -> vthread -> threadIdx -> registers: binding the vthread loop
outside the thread loop interleaves each thread's V sub-tiles, so neighbouring threads touch
neighbouring elements (coalesced stores, fewer shared-memory bank conflicts). Reduction axes are
split ``[ext/chunk, chunk]``; per outer reduction step every input tile is staged in shared
memory by all threads together, with the producers (padding) inlined into that load so padding
costs nothing in the inner loop. Accumulators live in registers and the consumers are applied
on the way out. Anything that does not fit raises; the caller falls back to dlight.
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ....targets import Target
from ....targets.table import STATIC_SHARED_BYTES
from ..tir_util import gpu_kernel_fault, has_if_then_else, is_reduction
from .plan import GPU_LEVELS, REDUCE, SPATIAL, TilePlan

MAX_THREADS = 1024              # unless the target's facts say otherwise
UNROLL_MAX_STEP = 512           # auto-unroll loop nests up to this many steps (registers, no index math)
VTHREAD_TAGS = ("vthread.x", "vthread.y", "vthread.z")


class GpuLowerError(ValueError):
    """The kernel or the plan does not fit this schedule template."""


def _extent(sch: s_tir.Schedule, loop) -> int:
    ext = sch.get(loop).extent
    if not isinstance(ext, tirx.IntImm):
        raise GpuLowerError("symbolic loop extent")
    return int(ext)


def _fuse(sch: s_tir.Schedule, loops: list):
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]


def _split_kernel(sch: s_tir.Schedule) -> tuple:
    """(anchor, producers, consumers) in block order; exactly one reduction block."""
    blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    reductions = [i for i, b in enumerate(blocks) if is_reduction(sch, b)]
    if len(reductions) != 1:
        raise GpuLowerError(f"needs exactly one reduction block, found {len(reductions)}")
    pos = reductions[0]
    return blocks[pos], blocks[:pos], blocks[pos + 1:]


def _check_plan(sch: s_tir.Schedule, anchor, loops: list, plan: TilePlan) -> None:
    """The plan must describe this anchor: same iterators, kinds and extents, one loop each."""
    if tuple(plan.levels) != GPU_LEVELS:
        raise GpuLowerError(f"plan levels {plan.levels} are not {GPU_LEVELS}")
    plan.check()
    ivs = list(sch.get(anchor).iter_vars)
    kinds = tuple(SPATIAL if iv.iter_type == tirx.IterVar.DataPar else REDUCE for iv in ivs)
    if tuple(iv.var.name for iv in ivs) != tuple(plan.axes) or kinds != tuple(plan.kinds):
        raise GpuLowerError(f"plan axes {plan.axes} do not match the anchor's {[iv.var.name for iv in ivs]}")
    if any(iv.iter_type not in (tirx.IterVar.DataPar, tirx.IterVar.CommReduce) for iv in ivs):
        raise GpuLowerError("unsupported iterator kind")
    if len(loops) != len(ivs) or [_extent(sch, lp) for lp in loops] != list(plan.extents):
        raise GpuLowerError("anchor loops and iterators are not one-to-one with the plan's extents")
    for d, k in enumerate(plan.kinds):
        if k == REDUCE and plan.tile(d, "thread") != 1:
            raise GpuLowerError(f"{plan.axes[d]}: a reduction's thread tile must be 1")


def _realize(func: tirx.PrimFunc, name: str):
    found: list = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlockRealize, found.append), order="pre")
    return next(r for r in found if r.block.name_hint == name)


def _vector_lanes(sch: s_tir.Schedule, block, inner: list, n: int, threads: int) -> int:
    """Lanes for a cooperative shared-memory load, or 1. Only plain copies whose global reads
    are provably aligned and contiguous (a float4 load of a misaligned address faults): no
    padding condition, unit stride in the last dimension, every other term a multiple of the
    lanes, and no predicate on the split."""
    blk = sch.get(block)
    store = blk.body
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tvm.ir.expr.TensorLoad):
        return 1
    load, src = store.value, blk.reads[0].source
    ana = tvm.sym.Analyzer()
    for lp in sch.get_loops(block):
        f = sch.get(lp)
        ana.bind(f.loop_var, tvm.ir.Range.from_min_extent(f.min, f.extent))
    for iv, value in zip(blk.iter_vars, _realize(sch.mod["main"], blk.name_hint).iter_values):
        ana.bind(iv.var, value)                # simplify() now substitutes the loop indices
    last = ana.simplify(load.indices[-1])
    inner_var = sch.get(inner[-1]).loop_var
    coef = tvm.sym.detect_linear_equation(last, [inner_var])
    if len(coef) != 2 or not isinstance(coef[0], tirx.IntImm) or int(coef[0]) != 1:
        return 1
    row = int(src.shape[-1]) if isinstance(src.shape[-1], tirx.IntImm) else 0
    for lanes in (4, 2):
        if (row % lanes == 0 and _extent(sch, inner[-1]) % lanes == 0 and n % (threads * lanes) == 0
                and src.dtype.bits * lanes <= 128
                and ana.can_prove_equal(tirx.floormod(coef[1], lanes), 0)):
            return lanes
    return 1


def lower_gpu(func: tirx.PrimFunc, plan: TilePlan, target: Target) -> tirx.PrimFunc:
    """Schedule `func` (producers, one reduction anchor, element-wise consumers) for CUDA as
    `plan` says. Raises (GpuLowerError or a TVM schedule error) when the kernel or the plan does
    not fit: more threads per block than the target allows (1024), over 48 KB of static shared
    memory (checked here from the staged tiles' loops, halos included, and again on the
    compacted buffers the compiler will declare), a producer or consumer that cannot be inlined,
    a plan for another anchor. More than three axes with vthreads share one fused vthread.x axis."""
    max_threads = int(target.facts.get("max_threads_per_block", MAX_THREADS))
    max_shared = min(STATIC_SHARED_BYTES, int(target.facts.get("smem_per_block_kb", 48)) * 1024)
    sch = s_tir.Schedule(func)
    anchor, producers, consumers = _split_kernel(sch)
    loops = sch.get_loops(anchor)
    _check_plan(sch, anchor, loops, plan)
    reads = [r.source.name for r in sch.get(anchor).reads
             if not r.source.same_as(sch.get(anchor).writes[0].source)]
    bx, tx, ro_loops, threads = _tile_and_bind(sch, loops, plan, max_threads)
    _accumulate_in_registers(sch, anchor, tx, consumers)
    _stage_in_shared_memory(sch, anchor, reads, producers, ro_loops[-1], threads, max_shared)
    sch.annotate(bx, "pragma_auto_unroll_max_step", UNROLL_MAX_STEP)
    sch.annotate(bx, "pragma_unroll_explicit", 1)
    sch.decompose_reduction(anchor, ro_loops[0])
    out = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    fault = gpu_kernel_fault(out, max_shared)
    if fault:
        raise GpuLowerError(fault)
    return out


def _tile_and_bind(sch: s_tir.Schedule, loops: list, plan: TilePlan, max_threads: int) -> tuple:
    """Tile: [blocks, vthreads, threads, inner] per spatial axis, [outer, chunk] per reduction;
    bind blocks, vthreads and threads. Returns (block loop, thread loop, outer reduction loops,
    threads per block)."""
    b_loops, v_loops, t_loops, i_loops, ro_loops, ri_loops, v_ext = [], [], [], [], [], [], []
    threads = 1
    for d, lp in enumerate(loops):
        ext, tb = plan.extents[d], plan.tile(d, "block")
        if plan.kinds[d] == SPATIAL:
            tt, v = plan.tile(d, "thread"), plan.vthread(d)
            b, vt, t, i = sch.split(lp, [ext // tb, v, tb // tt, tt // v])
            b_loops.append(b), v_loops.append(vt), t_loops.append(t), i_loops.append(i), v_ext.append(v)
            threads *= tb // tt
        else:
            o, i = sch.split(lp, [ext // tb, tb])
            ro_loops.append(o), ri_loops.append(i)
    if threads > max_threads:
        raise GpuLowerError(f"{threads} threads per block (at most {max_threads})")
    sch.reorder(*b_loops, *v_loops, *t_loops, *ro_loops, *ri_loops, *i_loops)
    bx = _fuse(sch, b_loops)
    sch.bind(bx, "blockIdx.x")
    virtual = [lp for lp, v in zip(v_loops, v_ext) if v > 1]
    if len(virtual) > len(VTHREAD_TAGS):       # adjacent after the reorder: one fused vthread axis
        virtual = [_fuse(sch, v_loops)]
    for lp, tag in zip(virtual, VTHREAD_TAGS):
        sch.bind(lp, tag)
    tx = _fuse(sch, t_loops)
    sch.bind(tx, "threadIdx.x")
    return bx, tx, ro_loops, threads


def _accumulate_in_registers(sch: s_tir.Schedule, anchor, tx, consumers: list) -> None:
    """Accumulate locally, apply the element-wise consumers while writing back."""
    writeback = sch.cache_write(anchor, 0, "local")
    sch.reverse_compute_at(writeback, tx, preserve_unit_loops=True)
    for c in consumers[:-1]:
        sch.compute_inline(c)
    if consumers:
        sch.reverse_compute_inline(consumers[-1])


def _stage_in_shared_memory(sch: s_tir.Schedule, anchor, reads: list[str], producers: list, outer_reduction,
                            threads: int, max_shared: int) -> None:
    """Each input's tile per outer reduction step, loaded by all threads (vectorized where the
    layout allows); producers (padding) are applied by the load."""
    staged = []
    for name in reads:
        idx = next(k for k, r in enumerate(sch.get(anchor).reads) if r.source.name == name)
        s = sch.cache_read(anchor, idx, "shared")
        sch.compute_at(s, outer_reduction, preserve_unit_loops=True)
        staged.append(s)
    for p in reversed(producers):
        sch.compute_inline(p)
    at = sch.get(outer_reduction).loop_var     # stable while the loop's body changes
    smem = 0
    for s in staged:
        s_loops = sch.get_loops(s)
        depth = next(k for k, lp in enumerate(s_loops) if sch.get(lp).loop_var.same_as(at)) + 1
        inner = s_loops[depth:]
        n = 1
        for lp in inner:
            n *= _extent(sch, lp)
        smem += n * max(sch.get(s).writes[0].source.dtype.bits // 8, 1)
        lanes = _vector_lanes(sch, s, inner, n, threads) if not has_if_then_else(sch.get(s).body) else 1
        fused = _fuse(sch, inner)
        if lanes > 1:
            _, t, vec = sch.split(fused, [None, threads, lanes])
            sch.vectorize(vec)
        else:
            _, t = sch.split(fused, [None, threads])
        sch.bind(t, "threadIdx.x")
    if smem > max_shared:
        raise GpuLowerError(f"{smem} bytes of shared memory per block (static limit {max_shared})")
