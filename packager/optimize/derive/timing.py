"""Timing a derived program against the operator it replaces, on the machine the target's
candidates are timed on: the operator as the packager builds it without the rewrite (sites.py:
TOPI's conv2d_transpose, the layout pass's packed conv) and every scope of the derived program as the packager will build it (a GEMM on a constant weight
as the layout pass's matmul at its measured panel width, the rest as generated), each scheduled
by Gensor (top-k + rules, measured), timed in alternation so both see the same machine. The
schedules and panel widths chosen on the way go to the tuning database, so a rebuild replays
them."""
from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import te, tirx, topi

from ..layout.matmul import MatmulSite
from ..layout.search import LayoutSearch
from ..schedule.contract import KernelScheduler
from .codegen import Kernel, kernels
from .expr import Scope, Tensor
from .layout import Relaid, gemm_order
from .match import instantiate, operands


def original_conv_transpose(data, weight, strides, pads, output_padding=(0, 0)) -> tirx.PrimFunc:
    """TVM's own conv2d_transpose (NCHW data, IOHW weight) as a PrimFunc."""
    x = te.placeholder(tuple(data), "float32", "x")
    w = te.placeholder(tuple(weight), "float32", "w")
    y = topi.nn.conv2d_transpose_nchw(x, w, list(strides), list(pads), "float32", list(output_padding))
    return te.create_prim_func([x, w, y])


def time_program(original: tirx.PrimFunc | None, program: Scope, relaid: dict[str, Relaid],
                 scheduler: KernelScheduler, top_k: int = 6, as_built_gemm: bool = True) -> list[float]:
    """ms of the original (when given) then of each of the program's kernels, timed in
    alternation (inf: failed to run)."""
    g = scheduler.searcher(top_k)
    search = LayoutSearch(scheduler)
    funcs = [g.schedule(original, "derive: original")[0]] if original is not None else []
    funcs += [g.schedule(as_built(k, relaid, search) if as_built_gemm else k.func, f"derive: {k.output}")[0]
              for k in kernels(program)]
    times = scheduler.time(funcs)
    g.db.save()
    search.save()
    return [t * 1e3 if t is not None else math.inf for t in times]


def time_against_original(original: tirx.PrimFunc, program: Scope, relaid: dict[str, Relaid],
                          scheduler: KernelScheduler) -> tuple[float, float]:
    """(original ms, derived ms: the sum of its kernels), timed in alternation."""
    first, *pieces = time_program(original, program, relaid, scheduler)
    if math.inf in (first, *pieces):              # a kernel that failed to run decides nothing
        return math.inf, math.inf
    return first, sum(pieces)


def as_built(k: Kernel, relaid: dict[str, Relaid], search: LayoutSearch):
    """A GEMM on the (re-laid) weight as the layout pass will build it; other scopes as they are."""
    gemm = gemm_order(k.scope)
    if gemm is None or gemm[0]:
        return k.func
    _, b = operands(k.scope)
    if not (isinstance(b.source, Tensor) and (b.source.name == "W" or b.source.name in relaid)):
        return k.func
    ext = k.scope.iters()
    m, n, kk = (math.prod(ext[x].extent for x in names) for names in gemm[1:])
    site = MatmulSite((m, kk), n, "float32")
    return site.kernel(search.decide_matmul(site).nt)


@dataclass
class Measured:
    """A derived program's kernels on this machine (ms each) and what each scope is."""

    kernels_ms: list[float]
    kinds: list[str]

    @property
    def total_ms(self) -> float:
        return sum(self.kernels_ms)


def measure(program: Scope, scheduler: KernelScheduler, top_k: int = 6) -> Measured:
    """Each scope as generated (no GEMM packing), scheduled by Gensor and timed in alternation."""
    kinds = {p.scope: p.kind for p in instantiate(program)}
    times = time_program(None, program, {}, scheduler, top_k, as_built_gemm=False)
    return Measured(times, [kinds.get(k.scope, "?") for k in kernels(program)])
