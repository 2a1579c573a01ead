"""The pass pipeline as data: every pass is an entry (name = its spec switch, the function, what
the report says when it does not run), a target kind's pipeline is an ordered list of entries
(PIPELINES, one row per backend kind), and one loop applies them, times them and reports
each as applied / disabled / not implemented.

Graph passes run on the Relax IRModule (per shape profile); kernel passes run per target on the
kernel table (PrimFuncs). A new technique is one module plus one entry in a list.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable

import tvm
from tvm import relax

from ..spec import OptimizeSpec
from ..targets import Target
from .base import PassReport
from .constfold import fold_constants
from .fastmath import LEGALIZATIONS as FAST_OPS, fastmath
from .fusion import fuse
from .bf16 import tile_dots
from .int8 import integer_kernels
from .globalfuse import combine_siblings, global_fusion
from .layout.clip import clip_as_ops
from .layout.conv import legalize_conv2d
from .ieee import LEGALIZATIONS as IEEE_OPS
from .layout.propagate import alter_layouts, keep_nchw
from .precision import to_precision
from .layout.memo import ProfileMemo
from .relax_util import legalize
from .variadic import variadic_to_binary
from .winograd import winograd_convs
from .derive.graph import derive_graph
from .schedule.contract import KernelScheduler, Tally
from .schedule.registry import scheduler_for
from .simplify import simplify


@dataclass
class PassContext:
    """What a pass may read besides its IR: the target (None for target-free graph passes), the
    optimize section of the spec, the layout choices shared by a model's shape profiles, and the
    build's tally of what timing cost. A pass asks the target's scheduler (`scheduler`), never
    which kind of device the target is."""

    target: Target | None
    opt: OptimizeSpec
    layout_memo: ProfileMemo | None = None
    notes: dict[str, Any] = field(default_factory=dict)   # what an earlier pass leaves for a later one
    log: Callable[[str], None] = print                     # progress of long passes (the tuner)
    tally: Tally = field(default_factory=Tally)

    @cached_property
    def scheduler(self) -> KernelScheduler:
        return scheduler_for(self.target, self.opt, self.tally)


@dataclass(frozen=True)
class Pass:
    """One pipeline entry. `run` is None for a technique this version does not implement."""

    name: str
    run: Callable[[Any, PassContext], tuple[Any, PassReport | None]] | None
    off: str = ""                  # report line when switched off ("": nothing reported)
    switch: Callable[[OptimizeSpec], bool] | None = None   # default: optimize.passes.<name> / level
    needs_target: bool = False     # skipped (and said) when the graph passes run without a target
    per_target: bool = False       # its output depends on the target: targets do not share its result

    def enabled(self, opt: OptimizeSpec) -> bool:
        return self.switch(opt) if self.switch else opt.enabled(self.name)


# Graph passes (Relax IRModule -> Relax IRModule).
SIMPLIFY = Pass("simplify", lambda mod, ctx: simplify(mod), off="off in the spec")
FASTMATH = Pass("fastmath", lambda mod, ctx: fastmath(mod), off="off in the spec: exact libm exp/erf/tanh/sigmoid")
LAYOUT = Pass("layout", lambda mod, ctx: alter_layouts(mod, ctx.scheduler, memo=ctx.layout_memo,
                                                      pad=ctx.opt.enabled("pad_channels"),
                                                      half=ctx.opt.enabled("half_blocks")),
              off="off in the spec: ONNX layouts (NCHW) everywhere", needs_target=True, per_target=True)
LAYOUT_KEEP_NCHW = Pass("layout", lambda mod, ctx: keep_nchw(mod, ctx.target),
                        off="off in the spec: ONNX layouts (NCHW) everywhere", needs_target=True)
# After the layout pass: it rewrites convs in the layouts the layout pass chose.
WINOGRAD = Pass("winograd", lambda mod, ctx: winograd_convs(mod, ctx.scheduler),
                off="off in the spec: every 3x3 conv direct", needs_target=True, per_target=True)
# optimize.precision: on when any target computes in less than fp32; each target then gets its own
# graph (its precision), and an fp32 target among them says so in its line. It runs on the graph
# ops as imported (before fastmath turns softmax into a PrimFunc call, which TVM's rewrite rejects).
def _precision(mod: tvm.IRModule, ctx: PassContext) -> tuple[tvm.IRModule, PassReport]:
    """fp16 through TVM's mixed-precision rewrite (precision.py); bf16 as TileDot kernels (bf16.py)."""
    want = ctx.opt.precision_of(ctx.target.name)
    return tile_dots(mod) if want == "bf16" else to_precision(mod, want, ctx.opt.keep_fp32)


PRECISION = Pass("precision", _precision,
                 off="fp32 everywhere (optimize.precision)", switch=lambda opt: opt.reduced(), needs_target=True,
                 per_target=True)

def _int8(mod: tvm.IRModule, ctx: PassContext) -> tuple[tvm.IRModule, PassReport]:
    """QDQ matmuls and convs in integers where the target's scheduler has integer kernels (int8.py)."""
    why = ctx.scheduler.lacks("int8")
    return (mod, PassReport("int8", "disabled", why)) if why else integer_kernels(mod, ctx.scheduler.integer_dots())


# Before simplify, which folds the weights' dequantize into float constants.
INT8 = Pass("int8", _int8, off="off in the spec: QDQ matmuls and convs in float32", needs_target=True, per_target=True)


def _legalize(mod: tvm.IRModule, fast: bool) -> tvm.IRModule:
    """Graph ops -> PrimFuncs: not an optimization (always on, not reported). Packed-layout convs
    get the layout package's compute, plain NCHW convs TVM's own legalization; relu/clip/max/min
    keep ONNX's NaN and infinity semantics (ieee.py; the importer's Clip kernels become graph ops
    first). A BatchNorm no conv absorbed (GPU targets: no layout pass decomposed it) is decomposed
    and its constant arithmetic folded with numpy first (constfold.py), not compiled op by op.
    With `fastmath` on, exp/erf/tanh/sigmoid/silu/gelu get their fast approximations here."""
    mod = clip_as_ops(variadic_to_binary(mod))[0]
    mod, _ = fold_constants(relax.transform.DecomposeOpsForInference()(mod))
    return legalize(mod, {"relax.nn.conv2d": legalize_conv2d, **IEEE_OPS, **(FAST_OPS if fast else {})})


LEGALIZE = Pass("legalize", lambda mod, ctx: (_legalize(mod, ctx.opt.enabled("fastmath")), None),
                switch=lambda opt: True)
FUSION = Pass("fusion", lambda mod, ctx: fuse(mod), off="off in the spec: one kernel per graph op")
# Souffle's global fusion in two places under one switch: sibling matmuls are combined on the
# graph (before layout packing, so the combined weight is packed once); layout copies fold into
# the kernels around them once FuseOps has formed kernels. Trial schedules make it per target.
GLOBAL_FUSION_SIBLINGS = Pass("global_fusion", combine_siblings)
GLOBAL_FUSION = Pass("global_fusion", global_fusion, off="off in the spec: FuseOps groups only",
                     needs_target=True, per_target=True)


def _derive(mod: tvm.IRModule, ctx: PassContext):
    """EinNet's derivations (derive/graph.py), timed where the target's candidates are timed (a
    target that is not decides on the roofline estimate). Convs are decided by timing alone,
    searched at level 3 (measured tuning) only."""
    return derive_graph(mod, ctx.scheduler, time_convs=ctx.opt.level >= 3)


# Before layout packing, so a derived matmul's constant weight is packed like any matmul's.
DERIVE = Pass("derive", _derive, off="off in the spec: no derivation-based rewrites", needs_target=True,
              per_target=True)


def _reuse(mod: tvm.IRModule, ctx: PassContext) -> tuple[tvm.IRModule, PassReport]:
    """ETO's reuse runs inside the passes that tune (layout candidates, schedule); this line says
    whether it can act for this target."""
    why = ctx.scheduler.reuse_note()
    if why is not None:
        return mod, PassReport("reuse", "disabled", why)
    return mod, PassReport("reuse", "applied", "ETO: a Gensor kernel is tuned from the program of the nearest "
                           "measured kernel with its sketch (this build's or the tuning database's); the schedule "
                           "and tuning lines give sources and programs timed (layout candidates are scored from "
                           "scratch)" + ("; the tuner adds ETO's bridge operators" if ctx.opt.enabled("bridges") and
                                         ctx.opt.tunes() else ""))


REUSE = Pass("reuse", _reuse, off="off (the default below level 3; optimize.passes.reuse turns it on): every kernel "
             "tuned from scratch", needs_target=True)


def _reuse_same(mod: tvm.IRModule, ctx: PassContext) -> tuple[tvm.IRModule, PassReport]:
    """Same-workload reuse runs inside the schedule pass; this line says whether it can act."""
    why = ctx.scheduler.reuse_note()
    if why is not None:
        return mod, PassReport("reuse_same", "disabled", why)
    if ctx.opt.enabled("reuse"):
        return mod, PassReport("reuse_same", "applied", "covered by ETO's reuse (nearest measured sketch)")
    return mod, PassReport("reuse_same", "applied", "a Gensor kernel whose exact workload (sketch and extents) was "
                           "measured before, usually by the layout search, is timed with that program, the best in "
                           "ETO's ranges and the cost model's best instead of top-k; the schedule line counts them")


REUSE_SAME = Pass("reuse_same", _reuse_same, off="off in the spec: every kernel not in the database tuned from scratch",
                  needs_target=True)


def _schedule_option(name: str, applied: str):
    """A pass whose technique is a candidate inside the schedule pass (and the layout search):
    its line says whether the target's scheduler offers it."""
    def line(mod: tvm.IRModule, ctx: PassContext) -> tuple[tvm.IRModule, PassReport]:
        why = ctx.scheduler.lacks(name)
        if why is not None:
            return mod, PassReport(name, "disabled", why)
        return mod, PassReport(name, "applied", applied)
    return line


WINDOW_ROWS = Pass("window_rows", _schedule_option(
    "window_rows", "kernels of few products per output (depthwise convs, pooling, 1x1 convs from few channels) are "
    "also offered rows of output positions in registers, timed beside Gensor's plans (untimed: ranked by the cost "
    "model); the schedule line counts the kernels that take one"),
    off="off in the spec: only Gensor's walk plans and the rules", needs_target=True)
PAD_INLINE = Pass("pad_inline", _schedule_option(
    "pad_inline", "depthwise convs and pooling over NCHW{c} may read their padding inline (each read tests its "
    "bounds) instead of copying padded rows, timed beside staged and per-task padding (untimed: their window plans "
    "take it); the schedule line counts them"),
    off="off in the spec: padding staged or per task only", needs_target=True)
COLD_HEAVY = Pass("cold_heavy", _schedule_option(
    "cold_heavy", "kernels whose weights outweigh their activations are timed with the caches flushed before every "
    "run, as the model leaves their weights; the schedule line counts them"),
    off="off in the spec: every kernel timed in the build's cache condition", needs_target=True)
NOT_IMPLEMENTED: dict[str, str] = {}          # pass name -> why, for a spec switch with no pass behind it


def _tuning(kernels: dict, ctx: PassContext) -> tuple[dict, PassReport]:
    """The measured search (level 3) where the target's kernels can be timed; it leaves its
    programs in the tuning database, which the schedule pass after it replays."""
    why = ctx.scheduler.why_not_tuned()
    if why is not None:
        return kernels, PassReport("tuning", "disabled", why)
    return ctx.scheduler.tune(kernels, ctx.log)


# Kernel passes (kernel table -> kernel table), per target.
TUNING = Pass("tuning", _tuning, off="off below level 3 without optimize.tuning.trials / seconds: no measured "
              "search beyond Gensor's top-k per kernel",
              switch=lambda opt: opt.tunes())

SCHEDULE_CPU = Pass("schedule", lambda kernels, ctx: ctx.scheduler.schedule_pass(kernels),
                    off="off in the spec: kernels are TVM's naive loops")
# A GPU kernel needs thread bindings: with the pass off only the fallback binding runs.
SCHEDULE_GPU = replace(SCHEDULE_CPU, off="", switch=lambda opt: True)   # reads the switch itself


def graph_pipeline(layout: Pass) -> list[Pass]:
    """The graph passes every target kind runs, with its own layout pass."""
    return [INT8, SIMPLIFY, PRECISION, FASTMATH, GLOBAL_FUSION_SIBLINGS, DERIVE, layout, WINOGRAD, LEGALIZE, FUSION,
            GLOBAL_FUSION, REUSE, REUSE_SAME, WINDOW_ROWS, PAD_INLINE, COLD_HEAVY]


# Per target kind (a backend's `kind`): its graph passes and its kernel passes, in order.
PIPELINES: dict[str, tuple[list[Pass], list[Pass]]] = {
    "cpu": (graph_pipeline(LAYOUT), [TUNING, SCHEDULE_CPU]),
    "cuda": (graph_pipeline(LAYOUT_KEEP_NCHW), [TUNING, SCHEDULE_GPU]),
}


def graph_passes(target: Target | None) -> list[Pass]:
    """A target kind's graph pipeline (the CPU one for graph passes run without a target)."""
    return PIPELINES[target.kind if target is not None else "cpu"][0]


def run_passes(ir: Any, passes: list[Pass], ctx: PassContext) -> tuple[Any, list[PassReport]]:
    """Apply the enabled passes in order; every pass that is off, not implemented or cannot run
    without a target gets its report line instead."""
    reports: list[PassReport] = []
    for p in passes:
        if not p.enabled(ctx.opt):
            if p.off:
                reports.append(PassReport(p.name, "disabled", p.off))
        elif p.run is None:
            reports.append(PassReport(p.name, "not implemented", NOT_IMPLEMENTED[p.name]))
        elif p.needs_target and ctx.target is None:
            reports.append(PassReport(p.name, "disabled", "no target given (graph passes without a target)"))
        else:
            t0 = time.perf_counter()
            ir, report = p.run(ir, ctx)
            if report is not None:
                report.seconds = time.perf_counter() - t0
                reports.append(report)
    return ir, reports


def pipeline_key(target: Target, passes: list[Pass], opt: OptimizeSpec) -> str:
    """Targets with the same key get the same graph-pass result, so they share one run: a target
    with an enabled target-dependent pass has its own."""
    per_target = [p.name for p in passes if p.per_target and p.enabled(opt)]
    return f"target:{target.name}" if per_target else "shared"


def optimize_graph(mod: tvm.IRModule, opt: OptimizeSpec, target: Target | None = None,
                   layout_memo: ProfileMemo | None = None, tally: Tally | None = None
                   ) -> tuple[tvm.IRModule, list[PassReport]]:
    """Relax in -> legalized (and, as enabled, simplified, re-laid-out and fused) Relax + PrimFuncs
    out, through the target kind's graph pipeline (the CPU one without a target); timing is
    counted into `tally`."""
    ctx = PassContext(target, opt, layout_memo, tally=tally if tally is not None else Tally())
    return run_passes(mod, graph_passes(target), ctx)


def optimize_kernels(kernels: dict, target: Target, opt: OptimizeSpec, log: Callable[[str], None] = print,
                     tally: Tally | None = None) -> tuple[dict, list[PassReport]]:
    """Per-target kernel passes (PrimFunc table in -> PrimFunc table out)."""
    ctx = PassContext(target, opt, log=log, tally=tally if tally is not None else Tally())
    return run_passes(kernels, PIPELINES[target.kind][1], ctx)
