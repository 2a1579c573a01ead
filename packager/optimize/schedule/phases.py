"""Phased GPU kernels: a kernel global fusion merged from a chain of kernels (attribute
PHASE_ATTR: how many top-level blocks each member brought) is scheduled phase by phase and
stitched back into one PrimFunc.

No GPU schedule rule fits a chain of matmuls as a whole (dlight and Gensor want one anchor), but
each phase alone is an ordinary kernel. The stitched PrimFunc lowers to one device kernel per
phase, with the tensors passed between phases in global scratch memory; the CUDA backend then
joins those device kernels into one cooperative kernel with a grid barrier between phases
(codegen/cuda_grid.py).
"""
from __future__ import annotations

from typing import Callable

import tvm_ffi
from tvm import tirx
from tvm.s_tir.stmt import SBlock, SBlockRealize

PHASE_ATTR = "packager.phase_blocks"
THREADS_ATTR = "packager.phase_threads"     # the block all phases take (Gensor plans chosen for it)
LAUNCH_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


class PhaseError(ValueError):
    """The kernel cannot be cut into phases that only pass tensors forward."""


def phase_sizes(func: tirx.PrimFunc) -> list[int] | None:
    sizes = func.attrs.get(PHASE_ATTR) if func.attrs is not None else None
    return [int(n) for n in sizes] if sizes is not None else None


def phase_threads(func: tirx.PrimFunc) -> int | None:
    n = func.attrs.get(THREADS_ATTR) if func.attrs is not None else None
    return int(n) if n is not None else None


def gensor_phase(construct, func: tirx.PrimFunc, threads: int | None = None):
    """Gensor's plan for a kernel or phase (None: dlight's rules take it); a phase that must run
    `threads` threads per block gets the best plan with that block when its own best differs."""
    made = construct.schedule(func)
    if made is not None and threads and thread_shape(made[0]) != (threads, 1, 1):
        made = construct.schedule(func, threads) or made
    return made


def top_blocks(func: tirx.PrimFunc) -> list:
    """The statements under the root block, one per computation of an unscheduled kernel."""
    root = _root(func)
    return list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]


def split_phases(func: tirx.PrimFunc, sizes: list[int]) -> tuple[list[tirx.PrimFunc], list]:
    """One PrimFunc per phase (the kernel's parameters and passed tensors it touches, so it is the
    kernel the phase was before the merge), and the tensors phases pass on. A tensor is passed on
    when more than one phase touches it; it must be written by the first phase that touches it,
    never by a later one."""
    stmts = top_blocks(func)
    if len(stmts) != sum(sizes) or not all(n > 0 for n in sizes):
        raise PhaseError(f"{len(stmts)} top-level blocks, phases of {sizes}")
    root = _root(func)
    phases, start = [], 0
    for n in sizes:
        phases.append(stmts[start:start + n])
        start += n
    touched = [_touched(p) for p in phases]
    allocs = list(root.alloc_buffers)
    passed = [b for b in allocs if sum(1 for t in touched if _has(t[0] | t[1], b)) > 1]
    for b in passed:
        users = [k for k, (r, w) in enumerate(touched) if _has(r | w, b)]
        writers = [k for k, (_, w) in enumerate(touched) if _has(w, b)]
        if writers != users[:1]:
            raise PhaseError(f"tensor {b.name} is written by phase(s) {writers}, used by {users}")
    out = []
    for (reads, writes), stmts_k in zip(touched, phases):
        used = reads | writes
        own = [b for b in allocs if not _has(set(passed), b) and _has(used, b)]
        params = [p for p in [*func.params, *passed] if _has(used, p)]
        body = tirx.SeqStmt(stmts_k) if len(stmts_k) > 1 else stmts_k[0]
        block = SBlock([], [], [], "root", body, alloc_buffers=own)
        out.append(tirx.PrimFunc(params, SBlockRealize([], True, block), func.ret_type,
                                 func.attrs).without_attr(PHASE_ATTR).without_attr(THREADS_ATTR))
    return out, passed


def stitch(func: tirx.PrimFunc, scheduled: list[tirx.PrimFunc], passed: list) -> tirx.PrimFunc:
    """The scheduled phases in order as one PrimFunc with `func`'s parameters; the passed tensors
    are its own (global) allocations."""
    bodies, allocs = [], list(passed)
    for f in scheduled:
        root = _root(f)
        allocs += list(root.alloc_buffers)
        bodies.append(root.body)
    block = SBlock([], [], [], "root", tirx.SeqStmt(bodies), alloc_buffers=allocs)
    attrs = {**dict(scheduled[0].attrs), PHASE_ATTR: [int(n) for n in phase_sizes(func)]}
    if phase_threads(func):
        attrs[THREADS_ATTR] = phase_threads(func)
    return tirx.PrimFunc(list(func.params), SBlockRealize([], True, block), func.ret_type).with_attrs(attrs)


def schedule_phases(func: tirx.PrimFunc, schedule_one: Callable[[tirx.PrimFunc], tuple[tirx.PrimFunc, str]]
                    ) -> tuple[tirx.PrimFunc, str]:
    """Schedule every phase with `schedule_one` and stitch; the rule reads 'phases(a + b)'."""
    phases, passed = split_phases(func, phase_sizes(func))
    done = [schedule_one(p) for p in phases]
    return stitch(func, [f for f, _ in done], passed), f"phases({' + '.join(r for _, r in done)})"


def thread_shape(func: tirx.PrimFunc) -> tuple[int, int, int] | None:
    """The block shape (threadIdx x, y, z extents) of a scheduled single-launch kernel, or None
    when its loops bind one thread axis with different extents (several launches)."""
    seen: dict[str, set[int]] = {}

    def visit(n):
        if n.kind == tirx.ForKind.THREAD_BINDING and n.thread_binding is not None:
            tag = str(n.thread_binding.thread_tag)
            if tag in LAUNCH_TAGS and isinstance(n.extent, tirx.IntImm):
                seen.setdefault(tag, set()).add(int(n.extent))

    tvm_ffi.structural_walk(func.body, ((tirx.For,), visit), order="pre")
    if any(len(v) != 1 for v in seen.values()):
        return None
    return tuple(next(iter(seen.get(t, {1}))) for t in LAUNCH_TAGS)


def _root(func: tirx.PrimFunc) -> SBlock:
    if not isinstance(func.body, SBlockRealize):
        raise PhaseError("the kernel has no root block")
    return func.body.block


def _touched(stmts: list) -> tuple[set, set]:
    reads, writes = set(), set()

    def visit(n):
        reads.update(r.source for r in n.reads)
        writes.update(w.source for w in n.writes)

    for s in stmts:
        tvm_ffi.structural_walk(s, ((SBlock,), visit), order="pre")
    return reads, writes


def _has(items: set, buf) -> bool:
    return any(buf.same_as(x) for x in items)
