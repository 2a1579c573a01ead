"""Row regions (CPU): a row-reduction kernel (softmax, layer norm) read only by a matmul (the
attention's P @ V, a pre-LN block's projection) joins it, and the row-region schedule
(schedule/rules/row.py) computes the reduction for each row tile inside the matmul's parallel
loop: the reduction's output no longer makes a round trip through memory, and the reduction
runs in the matmul's parallel region. A second stage takes the matmul whose only reader is such a
region (the attention's scores Q @ K^T): the whole attention of a row tile is then one region and
the score matrix never leaves the cache (Souffle's "BERT's attention block in one kernel", as a
CPU row region).

Taken only when the merged kernel gets the row-region rule and, where the target runs on this
machine, is not measured slower than the two kernels it replaces beyond the timer's resolution
(timing.pays), each side timed with the schedule the schedule pass will give it (Souffle refuses
fusions that do not pay). Where the target is not timed, a region that takes a matmul is
refused when its tiles are partial (measured up to 8x slower on x86).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from .graph import KernelGraph, kernel_graph
from .outline import Group, merged_kernels, outline
from .timing import FusionTimer

REDUCTION_RULES = ("vector-row-reduction", "row-reduction")
MATMUL_RULES = ("tiled-reduction",)


@dataclass
class Merged:
    """What a stage that merges (producer, reader) pairs took, refused and measured."""

    taken: int = 0
    refused: dict[str, str] = field(default_factory=dict)
    measured: list[dict] = field(default_factory=list)     # kernel, fused_us, separate_us
    timed: bool = False                                    # the target runs here and measuring is on
    skipped: str = ""                                      # why none were tried

    def gain(self) -> str:
        if not self.measured:
            return ""
        x = sum(m["separate_us"] for m in self.measured) / max(sum(m["fused_us"] for m in self.measured), 1e-9)
        return f" (measured: the kernels they replace take {x:.2f}x their time)"

    def as_dict(self) -> dict:
        return {"taken": self.taken, "refused": self.refused, "measured": self.measured}

    def finish_line(self, text: str, not_timed: str) -> str:
        """A stage's report line after its own count: why it was skipped, or that its merges were
        not measured (`not_timed` says why), then the measured gain."""
        if self.skipped:
            return f"{text} ({self.skipped})"
        if self.taken and not self.timed:
            text += f" (not measured: {not_timed})"
        return text + self.gain()


@dataclass
class RowRegions(Merged):
    with_matmul: int = 0                                   # of those, regions that took the matmul before them

    def as_dict(self) -> dict:
        return {**super().as_dict(), "with_matmul": self.with_matmul}

    def line(self) -> str:
        text = f"row regions (softmax / layer norm into the matmul reading it): {self.taken}"
        if self.with_matmul:
            text += f", {self.with_matmul} with the matmul before them (attention in one region)"
        return self.finish_line(text, "the target does not run here and has no rpc device, or tuning.measure is off")


def row_regions(mod: tvm.IRModule, ctx, rules, timer: FusionTimer | None) -> tuple[tvm.IRModule, RowRegions]:
    """Merge each (row reduction, its only reader: a matmul) pair that schedules and pays, then
    each (matmul, its only reader: such a region) pair."""
    out = RowRegions(timed=timer is not None)
    g = planned_graph(mod, ctx, out, "row_regions")
    if g is None:
        return mod, out

    def refusal(g: KernelGraph, r: int, c: int, func) -> str:
        return _refusal(g, r, c, func, rules, timer, out)

    mod, out.taken = merge_pairs(mod, g, _pairs(g, rules), "gf_row_", refusal, out)
    g = kernel_graph(mod)
    mod, out.with_matmul = merge_pairs(mod, g, _matmul_pairs(g, rules), "gf_attn_", refusal, out)
    return mod, out


def planned_graph(mod: tvm.IRModule, ctx, out: Merged, technique: str) -> KernelGraph | None:
    """The kernel graph to plan `technique` on; None (with the scheduler's reason in `out.skipped`)
    when the target's kind does not do it."""
    why = ctx.scheduler.lacks(technique)
    if why:
        out.skipped = why
        return None
    return kernel_graph(mod)


def merge_pairs(mod: tvm.IRModule, g: KernelGraph, candidates: list, prefix: str, refusal,
                out: Merged) -> tuple[tvm.IRModule, int]:
    """The module with the (producer, its only reader) pairs merged whose merged kernel
    `refusal(g, producer, reader, func)` has no objection to (""), and how many; the objections
    go to `out.refused`."""
    measured = len(out.measured)
    for _ in range(2):                           # a second round without the refused pairs
        if not candidates:
            return mod, 0
        groups = [Group(f"{prefix}{g.calls[c].name.removeprefix('gf_')}"[:80] + f"_{k}", (r, c), (c,), c)
                  for k, (r, c) in enumerate(candidates)]
        fused_mod = outline(mod, g, groups)
        keep = []
        for (r, c), func in zip(candidates, merged_kernels(fused_mod, g, groups)):
            why = refusal(g, r, c, func)
            if why:
                out.refused[f"{g.bindings[c].var.name}={g.calls[r].name}+{g.calls[c].name}"] = why
            else:
                keep.append((r, c))
        if len(keep) == len(candidates):
            return fused_mod, len(keep)
        candidates = keep
        del out.measured[measured:]
    return mod, 0


def _pairs(g: KernelGraph, rules) -> list[tuple[int, int]]:
    """(row reduction, the matmul reading it)."""
    return pairs_of(g, rules, REDUCTION_RULES, MATMUL_RULES)


def _matmul_pairs(g: KernelGraph, rules) -> list[tuple[int, int]]:
    """(matmul, row region reading it): the scores Q @ K^T joining the softmax @ V region, so
    the whole attention of a row tile is one region (the scores never leave the cache)."""
    return pairs_of(g, rules, MATMUL_RULES, ("row-region",))


def pairs_of(g: KernelGraph, rules, producer_rules: tuple, reader_rules: tuple,
             accept=None) -> list[tuple[int, int]]:
    """(producer, its only reader) pairs whose kernels get these rules (and that `accept(producer,
    reader)` takes, when given); the producer's value must not leave the model. A kernel joins
    one pair at most: a region that reads two such producers (ONNX's expanded Attention: the
    scores matmul and a separate row max) takes the first, since outlining both with it would
    form a cycle."""
    pairs, used = [], set()
    for p, call in g.calls.items():
        readers = g.consumers[p]
        if p in g.returned or len(readers) != 1 or readers[0] not in g.calls:
            continue
        c = readers[0]
        if p in used or c in used:
            continue
        if (rules.rule(call.prim) in producer_rules and rules.rule(g.calls[c].prim) in reader_rules
                and (accept is None or accept(call.prim, g.calls[c].prim))):
            pairs.append((p, c))
            used |= {p, c}
    return pairs


def predicated(func: tirx.PrimFunc) -> bool:
    """Some block of the scheduled kernel runs under a predicate (a partial tile)."""
    found = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlockRealize, lambda b: found.append(
        not (isinstance(b.predicate, tirx.IntImm) and int(b.predicate.value) == 1))), order="post")
    return any(found)


def _refusal(g: KernelGraph, r: int, c: int, func, rules, timer, out: RowRegions) -> str:
    if func is None:
        return "not merged by FuseTIR"
    rule = rules.rule(func)
    if rule != "row-region":
        return f"no row-region schedule: {rules.refusal(func, 'row_region')}"
    if timer is None:
        if rules.rule(g.calls[r].prim) in MATMUL_RULES and predicated(rules.scheduled(func).func):
            return ("not measured, and its tiles are predicated (rows or columns not a multiple of the tile): "
                    "such regions were measured up to 8x slower on x86 (ViT's 197 tokens)")
        return ""
    why, entry = timer.verdict(func, [(g.calls[r].prim, 1.0), (g.calls[c].prim, 1.0)], "row region")
    if not why:
        out.measured.append({"kernel": g.calls[c].name, **entry})
    return why
