"""Reduction epilogues (CPU): a memory-intensive reduction (few outputs per input: CSRNet's 1x1
conv from 32 channels to one density map, a global average pool) that is the only reader of a
compute-intensive conv or matmul joins it, and the reduction-epilogue schedule
(schedule/rules/epilogue.py) sums each tile of the producer's output right after computing it:
that output never makes a round trip through memory (Souffle's memory-intensive TE attached to
its compute-intensive producer's tile, here where the attached TE is itself a reduction, which
FuseOps never fuses). Taken on the zoo: CSRNet's head, and the global pool after ResNet-50's and
MobileNetV2's last conv.

Taken as row regions are (rowregion.py): only when the merged kernel gets its rule and, where
the target is timed, is not measured slower than the two kernels it replaces; where it is not
timed, only when no tile is partial.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm

from ..kernel_cost import kernel_cost
from .analyze import COMPUTE_INTENSIVE
from .graph import KernelGraph
from .rowregion import MATMUL_RULES, Merged, merge_pairs, pairs_of, planned_graph, predicated
from .timing import FusionTimer

RULE = "reduction-epilogue"


@dataclass
class Epilogues(Merged):
    def line(self) -> str:
        return self.finish_line(f"reduction epilogues (a memory-intensive reduction summing its conv / matmul "
                                f"producer's output): {self.taken}", "the target is not timed here")


def reduction_epilogues(mod: tvm.IRModule, ctx, rules, timer: FusionTimer | None) -> tuple[tvm.IRModule, Epilogues]:
    """Merge each (compute-intensive reduction, its only reader: a memory-intensive reduction)
    pair that schedules as one and pays."""
    out = Epilogues(timed=timer is not None)
    g = planned_graph(mod, ctx, out, "reduction_epilogues")
    if g is None:
        return mod, out

    def refusal(g: KernelGraph, p: int, c: int, func) -> str:
        if func is None:
            return "not merged by FuseTIR"
        if rules.rule(func) != RULE:
            return f"no {RULE} schedule: {rules.refusal(func, 'reduction_epilogue')}"
        if timer is None:
            return "not measured, and its tiles are predicated" if predicated(rules.scheduled(func).func) else ""
        why, entry = timer.verdict(func, [(g.calls[p].prim, 1.0), (g.calls[c].prim, 1.0)], "reduction epilogue")
        if not why:
            out.measured.append({"kernel": g.calls[c].name, **entry})
        return why

    mod, out.taken = merge_pairs(mod, g, pairs_of(g, rules, MATMUL_RULES, MATMUL_RULES, _memory_reader), "gf_epi_",
                                 refusal, out)
    return mod, out


def _memory_reader(producer, reader) -> bool:
    """The reader moves more bytes than it computes on (Souffle's memory-intensive class) and its
    producer is compute-intensive: attaching it to the producer's tile costs little."""
    return (kernel_cost(reader).intensity < COMPUTE_INTENSIVE
            and kernel_cost(producer).intensity >= COMPUTE_INTENSIVE)
