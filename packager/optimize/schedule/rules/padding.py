"""Where a conv's or pooling's padding stage is computed: once for the whole kernel (staged, the
rules' choice), inside each parallel task, only the rows that task reads, or nowhere: the kernel's
reads test their bounds (inline) (TilePlan.pad).

A staged pad is one more pass over the input: read it, write a padded copy, and the kernel reads
that copy again. For a kernel that reads each input element a few times (depthwise convs and
pooling: a reduction of at most MEMORY_BOUND_REDUCTION products per output) that pass is a large
share of its memory traffic; per task, the padded rows are written into a small buffer that stays
in the core's cache while the task reads them. Measured on the 2-core AMD EPYC (Gensor's best of
each, fresh database): ResNet's 3x3/2 max pool over 64x112x112 0.17-0.19 -> 0.06-0.08 ms;
MobileNetV2's depthwise 3x3 convs 96x112x112/2 0.23 -> 0.15-0.17 ms, 144x56x56 0.13-0.15 -> 0.09-0.10
ms, 144x56x56/2 0.11-0.19 -> 0.06 ms. Convs that reduce over input channels got 5-20% slower
per task (the halo rows are padded twice, and their pad pass is a small share), so only the
memory-bound kernels are offered the choice, and measurement makes it.

Per task is still a copy of every input row. Over NCHW{c} a read's bounds test depends on the
position only, the same for all lanes, and is well predicted: inline, the window plans' kernels
took 0.45-0.93 of their per-task time on the same EPYC (depthwise 3x3/2 96x112x112 0.093 -> 0.056
ms, 144x56x56 3x3/1 0.085 -> 0.071, 5x5/2 672x14x14 0.019 -> 0.011, max pool 3x3/2 64x112x112
0.072 -> 0.032; bit-identical outputs). Dense 3x3 convs came out 0.88-2.15x their staged time
inline, so they are not offered it.
"""
from __future__ import annotations

import math
from dataclasses import replace

import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir import expr as ir

from ..hardware import MEMORY_BOUND_REDUCTION
from ..tir_util import Anchor, free_vars
from .transpose import read_stride



def offers_per_task(anchor: Anchor) -> bool:
    """The kernel has a padding stage and reads each input element only a few times."""
    volume = math.prod(anchor.extents[iv.var] for iv, _ in anchor.reduce)
    return bool(anchor.staged) and volume <= MEMORY_BOUND_REDUCTION


def offers_inline(sch: s_tir.Schedule, anchor: Anchor) -> bool:
    """The padding stages may be inlined: the kernel offers per-task padding, it reads every
    staged input itself (not through a de-interleaving stage), and no padded dimension of one
    is indexed by the vector iterator, so a read's bounds test is the same for all lanes
    (NCHW{c}: the lanes are channels). Along a padded row the test varies per lane and the reads
    no longer vectorize (NCHW depthwise convs ran 1.4-9.6x slower). Each stage must also be a
    plain copy, its lanes read contiguously: one that gathers them (a layout transform folded
    into the kernel) would gather every input k x k / stride^2 times instead of once."""
    if not offers_per_task(anchor) or anchor.vec is None:
        return False
    vec = anchor.vec[0].var
    reads = sch.get(anchor.block).reads
    for b in anchor.staged:
        stage = sch.get(b)
        padded = _padded_dims(stage)
        mine = [r for r in reads if r.source.same_as(stage.writes[0].source)]
        if not mine or any(any(v.same_as(vec) for v in free_vars(r.region[d].min)) for r in mine for d in padded):
            return False
        if not stage.iter_vars or read_stride(stage, stage.iter_vars[-1].var) != 1:
            return False
    return True


def _padded_dims(stage) -> list[int]:
    """The dimensions of a padding block's output indexed by an iterator its bounds test
    constrains (a de-interleaved output splits one padded axis over two dimensions)."""
    tested: list = []

    def visit(call):
        if getattr(call.op, "name", "").endswith("if_then_else"):
            tested.extend(free_vars(call.args[0]))

    tvm_ffi.structural_walk(stage.body, (ir.Call, visit), order="post")
    return [d for d, rg in enumerate(stage.writes[0].region)
            if any(v.same_as(t) for v in free_vars(rg.min) for t in tested)]


def pad_per_task(sch: s_tir.Schedule, staged: list, task_loop) -> None:
    """Each staged block computed inside `task_loop` (the parallel loop), its innermost loop
    vectorized where it is the constant channel block of a packed layout."""
    for b in staged:
        sch.compute_at(b, task_loop)
        inner = sch.get_loops(b)[-1]
        ext = sch.get(inner).extent
        if isinstance(ext, tirx.IntImm) and int(ext) in (4, 8, 16, 32, 64):
            sch.vectorize(inner)


def pad_inline(sch: s_tir.Schedule, anchor: Anchor) -> Anchor:
    """The padding stages inlined into the anchor's reads (each read tests its bounds): the
    anchor prepared without them."""
    for b in anchor.staged:
        sch.compute_inline(b)
    return replace(anchor, staged=[])
