"""`winograd` (graph pass, after the layout pass): a 3x3 stride-1 conv over channel-blocked
layouts computed as Winograd F(m x m, 3 x 3) where that measures faster than the direct conv.

The conv becomes three graph steps (compute.py): the input transform (a kernel), a batched
matmul on the transformed weight (a constant made at build time; Gensor schedules it like any
matmul) and the output transform, which takes the conv's epilogue (bias, activation, residual)
when FuseOps fuses it. Per conv shape, the direct conv (as the layout pass chose it) and the
three kernels of F(4x4) and of F(2x2) are scheduled and timed in alternation on the machine the
target is timed on, as the package runs them (each tile's kernels back to back, their input just
written, their weights out of the caches: measure/chain.py); a tile wins at MARGIN x the direct
conv or less, and the decision goes to the tuning database, so a rebuild replays it. A target
whose kernels are not timed at build time keeps every conv direct (docs/winograd.md).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import tvm
from tvm import relax, te

from ..base import PassReport
from ..layout.conv import ConvLayouts, conv2d_packed, parse_data_layout, parse_kernel_layout
from ..relax_util import bound_value, is_const, rewrite_functions
from ..schedule.contract import KernelScheduler, winograd_stage as stage
from .compute import Geometry, batched_gemm, input_transform, output_transform, weight_transform

TILES = (4, 2)                 # F(4x4, 3x3), F(2x2, 3x3)
MIN_CHANNELS = 16              # fewer input or output channels leave the GEMMs too thin to pay
TOP_K = 6                      # Gensor's plans timed per kernel (the schedule pass's default)
MARGIN = 0.9                   # Winograd must time this fraction of the direct conv or less: timing noise,
                               # and the caches the rest of the model leaves, which a chain timed alone does not see
RECORD = "winograd-cpu"        # tuning database kind of a decision
OUT_ELEMWISE_FUSABLE = 4       # TVM's OpPatternKind kOutEWiseFusable


@dataclass(frozen=True)
class Site:
    """One eligible conv: its shape, layouts and weight (OIHW, float32)."""

    geometry: Geometry           # with m = 0: the tile is what is decided
    data_block: int
    out_block: int
    weight_blocks: tuple[int, int]     # the direct conv's weight layout (input, output block)
    weight: np.ndarray

    def key(self, target_key: str) -> str:
        g = self.geometry
        return (f"winograd:{target_key}:n{g.n} c{g.channels} k{g.out_channels} {g.h}x{g.w} -> {g.oh}x{g.ow} "
                f"pad {g.pad_top},{g.pad_left} blocks {self.data_block}/{self.out_block} weight "
                f"{self.weight_blocks[0]}i{self.weight_blocks[1]}o")

    def with_tile(self, m: int) -> Geometry:
        return replace(self.geometry, m=m)


def _oihw(weight: np.ndarray) -> np.ndarray:
    """A conv weight, plain (OIHW) or packed (O/o, I/i, KH, KW, i, o), as OIHW."""
    if weight.ndim == 4:
        return weight
    oo, io, kh, kw, ib, ob = weight.shape
    return weight.transpose(0, 5, 1, 4, 2, 3).reshape(oo * ob, io * ib, kh, kw)


def constant_weight(m: relax.PyExprMutator, e: relax.Expr) -> np.ndarray | None:
    """The conv weight as OIHW numpy: a constant, or a constant's layout transforms (the layout
    pass folds them at build time, after this pass); None when it is computed at run time."""
    e = bound_value(m, e)
    if is_const(e):
        return _oihw(e.value.numpy())
    if isinstance(e, relax.Call) and getattr(e.op, "name", None) == "relax.layout_transform":
        source = bound_value(m, e.args[0])
        return source.value.numpy() if is_const(source) and source.value.numpy().ndim == 4 else None
    return None


def site_of(call: relax.Call, weight: np.ndarray | None) -> tuple[Site | None, str]:
    """The conv as a Winograd site, or (None, why not)."""
    a = call.attrs
    if [int(k) for k in call.args[1].ty.shape.values[2:4]] != [3, 3]:
        return None, ""                               # not a 3x3 conv: nothing to say
    if [int(s) for s in a.strides] != [1, 1] or [int(d) for d in a.dilation] != [1, 1] or int(a.groups) != 1:
        return None, "strided, dilated or grouped"
    try:
        data_block = parse_data_layout(a.data_layout)
        out_block = parse_data_layout(a.out_layout or a.data_layout)
        weight_blocks = parse_kernel_layout(a.kernel_layout)
    except ValueError:
        return None, "layout not channel-blocked"
    if data_block == 1 or out_block == 1:
        return None, "NCHW input or output"
    if weight is None or str(call.ty.dtype) != "float32":
        return None, "weight not a float32 constant"
    data = [int(d) for d in call.args[0].ty.shape.values]
    out = [int(d) for d in call.ty.shape.values]
    channels, out_channels = data[1] * data[4], out[1] * out[4]
    if min(channels, out_channels) < MIN_CHANNELS:
        return None, f"fewer than {MIN_CHANNELS} channels"
    if weight.shape[0] > out_channels or weight.shape[1] > channels:
        return None, "weight wider than the conv"
    # channels the layout pass padded to whole blocks (layout/pad.py) have zero weights
    w = np.pad(weight.astype(np.float32), [(0, out_channels - weight.shape[0]), (0, channels - weight.shape[1]),
                                           (0, 0), (0, 0)])
    pads = [int(p) for p in a.padding]
    g = Geometry(data[0], channels, out_channels, data[2], data[3], out[2], out[3], pads[0], pads[1], 0)
    return Site(g, data_block, out_block, weight_blocks, w), ""


def _kernels(site: Site, m: int) -> list[tvm.tirx.PrimFunc]:
    """The input transform, the GEMM and the output transform of F(m x m) for `site`."""
    g = site.with_tile(m)
    d = te.placeholder((g.n, g.channels // site.data_block, g.h, g.w, site.data_block), name="d")
    v_shape, u_shape = g.gemm_shapes()
    v, u = te.placeholder(v_shape, name="v"), te.placeholder(u_shape, name="u")
    mm = te.placeholder((v_shape[0], v_shape[1], g.out_channels), name="mm")
    return [te.create_prim_func([d, input_transform(d, g)]), te.create_prim_func([v, u, batched_gemm(v, u)]),
            te.create_prim_func([mm, output_transform(mm, g, site.out_block)])]


def _direct(site: Site) -> tvm.tirx.PrimFunc:
    """The conv as the schedule pass would build it without this pass."""
    g = site.geometry
    d = te.placeholder((g.n, g.channels // site.data_block, g.h, g.w, site.data_block), name="d")
    wi, wo = site.weight_blocks
    w = te.placeholder((g.out_channels // wo, g.channels // wi, 3, 3, wi, wo), name="w")
    pads = (g.pad_top, g.pad_left, g.oh + 2 - g.h - g.pad_top, g.ow + 2 - g.w - g.pad_left)
    y = conv2d_packed(d, w, ConvLayouts(site.data_block, wi, wo, site.out_block), g.channels, g.out_channels,
                      (1, 1), pads, (1, 1), 1, "float32")
    return te.create_prim_func([d, w, y])


def decide(site: Site, scheduler: KernelScheduler, db) -> dict:
    """{"m": tile or 0 (direct), "direct_ms", "f4_ms", "f2_ms"}: recorded, or timed now as the
    package runs them (the direct conv, and each tile's three kernels back to back, their input
    just written and their weights out of the caches)."""
    key = site.key(scheduler.target_key())
    record = db.get(key, measured_only=True, kind=RECORD)
    if record is not None:
        return record
    g = scheduler.searcher(TOP_K, db=db)
    chains = [[g.schedule(_direct(site), "winograd: direct conv")[0]]]
    for m in TILES:
        chains.append([g.schedule(f, f"winograd F({m}x{m}): {step}")[0]
                       for f, step in zip(_kernels(site, m), ("input", "gemm", "output"))])
    ms = [t * 1e3 if t is not None else float("inf") for t in scheduler.time_chains(chains)]
    record = {"direct_ms": ms[0], "measured": True}
    best, best_ms = 0, ms[0] * MARGIN
    for m, total in zip(TILES, ms[1:]):
        record[f"f{m}_ms"] = total
        if total < best_ms:
            best, best_ms = m, total
    record["m"] = best
    db.put(key, record, RECORD, scheduler.target_key())
    return record


@relax.expr_functor.mutator
class _Winograd(relax.PyExprMutator):
    """Rewrites each eligible conv whose decided tile is not 0 into the three Winograd steps."""

    def __init__(self, mod: tvm.IRModule, choose: Callable[[Site], dict]):
        super().__init__(mod)
        self.choose = choose
        self.decisions: dict[str, dict] = {}          # site key -> decision
        self.convs: Counter = Counter()                # tile (0: direct) -> convs
        self.skipped: Counter = Counter()              # why not eligible -> convs

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.nn.conv2d":
            return call
        site, why = site_of(call, constant_weight(self, call.args[1]))
        if site is None:
            if why:
                self.skipped[why] += 1
            return call
        key = site.key("")
        if key not in self.decisions:
            self.decisions[key] = self.choose(site)
        m = int(self.decisions[key]["m"])
        self.convs[m] += 1
        if not m:
            return call
        g = site.with_tile(m)
        bb = self.builder_
        v = bb.emit_te(lambda x: input_transform(x, g), call.args[0], primfunc_name_hint="winograd_input")
        mm = bb.emit(relax.op.matmul(v, relax.const(weight_transform(site.weight, m))))
        return bb.call_te(lambda x: output_transform(x, g, site.out_block), mm, primfunc_name_hint="winograd_output")


def _fusable_outputs(mod: tvm.IRModule) -> tvm.IRModule:
    """Output transforms marked as a conv is (kOutEWiseFusable), so FuseOps gives them the conv's
    epilogue: TVM's pattern analysis calls a reduction with constant coefficients kCommReduce."""
    for gv, f in list(mod.functions_items()):
        if isinstance(f, tvm.tirx.PrimFunc) and (stage(f) or ("",))[0] == "output":
            mod.update_func(gv, f.with_attr("op_pattern", OUT_ELEMWISE_FUSABLE))
    return mod


def rewrite(mod: tvm.IRModule, choose: Callable[[Site], dict]) -> tuple[tvm.IRModule, _Winograd]:
    """The module with each eligible conv rewritten as `choose(site)["m"]` says
    (0: direct), and what was done."""
    m = _Winograd(mod, choose)
    return _fusable_outputs(relax.transform.DeadCodeElimination()(rewrite_functions(m, mod))), m


def winograd_convs(mod: tvm.IRModule, scheduler: KernelScheduler) -> tuple[tvm.IRModule, PassReport]:
    """The module with its eligible 3x3 convs as Winograd where timing says so; the report counts
    the convs per algorithm and gives each shape's times."""
    if not scheduler.measuring:
        return mod, PassReport("winograd", "disabled", "this target's kernels are not timed at build time: every 3x3 "
                               "conv stays direct (the choice is made by timing)")
    opened: list = []                  # the tuning database, read at the first eligible conv only: a model
                                       # without one (most conformance cases, every transformer) skips the parse

    def choose(site: Site) -> dict:
        if not opened:
            opened.append(scheduler.database())
        return decide(site, scheduler, opened[0])

    out, m = rewrite(mod, choose)
    for db in opened:
        db.save()
    done = ", ".join(f"{n} as F({t}x{t}, 3x3)" for t, n in sorted(m.convs.items(), reverse=True) if t)
    direct = m.convs.get(0, 0)
    before = sum(d["direct_ms"] for d in m.decisions.values())
    after = sum(d[f"f{d['m']}_ms"] if d["m"] else d["direct_ms"] for d in m.decisions.values())
    summary = (f"{sum(m.convs.values())} 3x3 stride-1 conv(s): {done or 'none as Winograd'}"
               + (f", {direct} direct (Winograd not under {MARGIN}x the direct conv when timed)" if direct else "")
               + (f"; {len(m.decisions)} conv shape(s) timed on this machine (or replayed from the tuning database): "
                  f"{before:.3f} ms direct -> {after:.3f} ms as chosen" if m.decisions else "")
               + ("; not eligible: " + ", ".join(f"{n} {why}" for why, n in sorted(m.skipped.items()))
                  if m.skipped else ""))
    shapes = {k.split(":", 2)[2]: {n: v for n, v in d.items() if n != "meta"} for k, d in m.decisions.items()}
    return out, PassReport("winograd", "applied", summary,
                           {"convs": {str(t): n for t, n in m.convs.items()}, "skipped": dict(m.skipped),
                            "shapes": shapes})
