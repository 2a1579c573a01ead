"""Layout chains: a layout kernel whose values are read by further layout kernels (a transformer's
head split, whose Q then gets squeezed and whose K gets transposed for Q @ K^T) becomes one
layout kernel that stores each reader's layout directly. Each value is then copied once instead
of twice, and the chain is one kernel instead of three.

This covers the copies that vertical.py could not fold into a reader (the attention matmuls lose
their schedule, or are measured slower, when they read through an index map). A merged chain is
still a layout kernel, so it must keep the head's schedule; where the target is timed here it is
also measured against its parts (Souffle refuses fusions that do not pay). Where it is not, it is
taken: it moves strictly fewer bytes than the kernels it replaces.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax

from .graph import KernelGraph, kernel_graph
from .outline import Group, merged_kernels, outline
from .timing import FusionTimer
from ..schedule.contract import KernelScheduler
from .trial import keeps_schedule
from .vertical import layout_kernels

MAX_ROUNDS = 3                 # a chain of n layout kernels needs n - 1 rounds


@dataclass
class Chains:
    taken: int = 0                                          # merged chains
    absorbed: int = 0                                       # layout kernels that left the plan
    refused: dict[str, str] = field(default_factory=dict)
    measured: list[dict] = field(default_factory=list)      # kernel, fused_us, separate_us
    timed: bool = False

    def line(self) -> str:
        text = f"layout chains (copies of copies stored once): {self.taken} (-{self.absorbed} kernels)"
        if self.measured:
            gain = sum(m["separate_us"] for m in self.measured) / max(sum(m["fused_us"] for m in self.measured), 1e-9)
            text += f" (measured: the kernels they replace take {gain:.2f}x their time)"
        elif self.taken and not self.timed:
            text += " (not measured: fewer bytes moved by construction)"
        return text

    def as_dict(self) -> dict:
        return {"taken": self.taken, "absorbed": self.absorbed, "refused": self.refused, "measured": self.measured}


def layout_chains(mod: tvm.IRModule, rules: KernelScheduler, timer: FusionTimer | None) -> tuple[tvm.IRModule, Chains]:
    """Merge layout kernels into the layout kernel they read, round by round (longer chains)."""
    out = Chains(timed=timer is not None)
    refused: set = set()                                    # head vars whose chain was refused
    for _ in range(MAX_ROUNDS):
        g = kernel_graph(mod)
        if g is None:
            break
        groups = chain_groups(g, {i for i, c in g.calls.items() if c.var in refused})
        if not groups:
            break
        fused = outline(mod, g, groups)
        keep, failed = _judge(g, groups, fused, rules, timer, out)
        refused |= {g.calls[grp.anchor].var for grp in failed}
        if keep:
            mod = outline(mod, g, keep) if failed else fused
            out.taken += len(keep)
            out.absorbed += sum(1 for grp in keep for i in grp.members if i in g.calls) - len(keep)
    return mod, out


def chain_groups(g: KernelGraph, refused: set[int]) -> list[Group]:
    """Each layout kernel (not `refused`) with the layout kernels that read nothing but one of its
    values. A kernel heads one group or joins one, never both in one round."""
    layout = layout_kernels(g)
    used: set[int] = set()
    groups = []
    for head in sorted(layout - refused):
        if head in used:
            continue
        values = _values(g, head)
        if values is None:
            continue
        readers = []
        for v in values:
            for r in g.consumers[v]:
                if r in layout and r not in used and r not in readers and g.call_inputs(r) == [v]:
                    readers.append(r)
        if not readers:
            continue
        leaving = [v for v in values if v in g.returned or any(r not in readers for r in g.consumers[v])]
        members = sorted({head, *values, *readers})
        used |= {head, *readers}
        name = ("gf_" + "_".join(g.calls[i].name.removeprefix("fused_") for i in [head, *readers]))[:80]
        groups.append(Group(f"{name}_{len(groups)}", tuple(members), tuple(sorted({*leaving, *readers})), head))
    return groups


def _values(g: KernelGraph, head: int) -> list[int] | None:
    """The bindings that hold `head`'s values: itself, or the items of its tuple (None when the
    tuple is read or returned whole: it cannot be taken apart)."""
    if not isinstance(g.calls[head].var.ty, relax.TupleType):
        return [head]
    items = g.consumers[head]
    if head in g.returned or any(i in g.calls or not isinstance(g.bindings[i].value, relax.TupleGetItem)
                                 for i in items):
        return None
    return items


def _judge(g: KernelGraph, groups: list[Group], fused_mod: tvm.IRModule, rules: KernelScheduler,
           timer: FusionTimer | None, out: Chains) -> tuple[list[Group], list[Group]]:
    """(groups taken, groups refused): a merged chain keeps the head's schedule and, where timed,
    is not measured slower than its parts."""
    keep, failed = [], []
    for grp, func in zip(groups, merged_kernels(fused_mod, g, groups)):
        head = g.calls[grp.anchor]
        why = ""
        if func is None:
            why = "not merged by FuseTIR"
        else:
            before, after = rules.rule(head.prim), rules.rule(func)
            if not keeps_schedule(before, after):
                why = f"{before} -> {after} when merged"
            elif timer is not None:
                parts = [(g.calls[i].prim, 1.0) for i in grp.members if i in g.calls]
                why, entry = timer.verdict(func, parts, "layout chain")
                if not why:
                    out.measured.append({"kernel": grp.name, **entry})
        if why:
            out.refused[grp.name] = why
            failed.append(grp)
        else:
            keep.append(grp)
    return keep, failed
