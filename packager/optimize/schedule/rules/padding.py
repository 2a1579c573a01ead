"""Where a conv's or pooling's padding stage is computed: once for the whole kernel (staged, the
rules' choice) or inside each parallel task, only the rows that task reads (TilePlan.pad).

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
"""
from __future__ import annotations

import math

from tvm import s_tir, tirx

from ..hardware import MEMORY_BOUND_REDUCTION
from ..tir_util import Anchor



def offers_per_task(anchor: Anchor) -> bool:
    """The kernel has a padding stage and reads each input element only a few times."""
    volume = math.prod(anchor.extents[iv.var] for iv, _ in anchor.reduce)
    return bool(anchor.staged) and volume <= MEMORY_BOUND_REDUCTION


def pad_per_task(sch: s_tir.Schedule, staged: list, task_loop) -> None:
    """Each staged block computed inside `task_loop` (the parallel loop), its innermost loop
    vectorized where it is the constant channel block of a packed layout."""
    for b in staged:
        sch.compute_at(b, task_loop)
        inner = sch.get_loops(b)[-1]
        ext = sch.get(inner).extent
        if isinstance(ext, tirx.IntImm) and int(ext) in (4, 8, 16, 32, 64):
            sch.vectorize(inner)
