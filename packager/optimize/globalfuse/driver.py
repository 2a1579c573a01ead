"""The global_fusion pass: plan on the kernel graph, outline, trial-schedule, report."""
from __future__ import annotations

import tvm

from ..base import PassReport
from ..kernel_cost import kernel_cost
from .analyze import te_summary
from .chains import layout_chains
from .epilogue import reduction_epilogues
from .graph import KernelGraph, kernel_graph
from .outline import Group, merged_kernels, outline
from .phases import grid_phases
from .rowregion import row_regions
from .timing import FusionTimer, fusion_timer
from ..schedule.contract import KernelScheduler
from .trial import keeps_schedule
from .vertical import epilogue_plan, fold_plan, layout_kernels

MAX_ROUNDS = 4


def traffic(mod: tvm.IRModule) -> tuple[int, int]:
    """(kernel calls, estimated DRAM bytes): every call reads its inputs and writes its outputs once."""
    g = kernel_graph(mod)
    if g is None:
        return 0, 0
    return len(g.calls), sum(kernel_cost(c.prim).bytes for c in g.calls.values())


def global_fusion(mod: tvm.IRModule, ctx) -> tuple[tvm.IRModule, PassReport]:
    g = kernel_graph(mod)
    if g is None:
        return mod, PassReport("global_fusion", "applied", "nothing to plan: main is not one data-flow block")
    n0, bytes0 = traffic(mod)
    analysis = te_summary(g)
    rules = ctx.scheduler
    timer = fusion_timer(ctx)
    try:
        vertical_note = rules.lacks("untimed_folds") if timer is None else None   # folded untimed?
        if vertical_note:
            out, groups, refused, timed = mod, [], {}, []
        else:
            out, groups, refused, timed = _vertical(mod, g, rules, timer)
        out, chains = layout_chains(out, rules, timer)
        out, rows = row_regions(out, ctx, rules, timer)
        out, epilogues = reduction_epilogues(out, ctx, rules, timer)
        out, phases = grid_phases(out, rules)
    finally:
        if timer:
            timer.save()              # decisions and Gensor's measurements, for rebuilds and the schedule pass
    horizontal = ctx.notes.get("horizontal", {"groups": 0, "matmuls": 0, "conv_groups_left": 0})
    report = _report(g, (n0, bytes0), traffic(out), groups, refused, timed, (chains, rows, epilogues, phases),
                     analysis, horizontal)
    if vertical_note:
        report.summary = report.summary.replace("folded:", f"folded ({vertical_note}):", 1)
        report.details["layout_note"] = vertical_note
    return out, report


def _report(g: KernelGraph, before: tuple[int, int], after: tuple[int, int], groups: list[Group],
            refused: dict[tuple[str, int], str], timed: list[dict], merges, analysis, horizontal: dict) -> PassReport:
    (n0, bytes0), (n1, bytes1) = before, after
    chains, rows, epilogues, phases = merges
    layout = layout_kernels(g)
    folded = {i for grp in groups for i in grp.members if i in layout}
    pro = sum(1 for grp in groups if grp.anchor in grp.outputs)
    measured = ""
    if timed:
        gain = sum(t["separate_us"] for t in timed) / max(sum(t["fused_us"] for t in timed), 1e-9)
        measured = f", {len(timed)} merged kernels measured: their parts take {gain:.2f}x their time"
    summary = (f"kernels after FuseOps {n0} -> {n1}, est. DRAM {bytes0 / 1e6:.2f} -> {bytes1 / 1e6:.2f} MB; "
               f"sibling matmuls combined: {horizontal['matmuls']} -> {horizontal['groups']}{_convs_left(horizontal)}; "
               f"layout copies (casts included) folded: {len(folded)} of {len(layout)} (into {pro} reader and "
               f"{len(groups) - pro} producer kernels{measured}; {len(layout - folded)} left); {chains.line()}; {rows.line()}; "
               f"{epilogues.line()}; "
               f"{phases.line()}; "
               f"{analysis.line()}")
    others = [rows.refused, epilogues.refused, chains.refused]
    reasons = sorted(set(refused.values()).union(*(r.values() for r in others)))
    if reasons:
        summary += f"; refused {len(refused) + sum(map(len, others))} (" + "; ".join(reasons)[:300] + ")"
    details = {"kernels_before": n0, "kernels_after": n1, "dram_bytes_before": bytes0, "dram_bytes_after": bytes1,
               "layout_kernels": len(layout), "layout_folded": len(folded), "horizontal": horizontal,
               "groups": [{"kernel": grp.name, "members": [_label(g, i) for i in grp.members]} for grp in groups],
               "refused": {f"{_label(g, i)} ({kind})": why for (kind, i), why in refused.items()},
               "analysis": analysis.as_dict(),
               "measured": timed,
               "layout_chains": chains.as_dict(),
               "row_regions": rows.as_dict(),
               "reduction_epilogues": epilogues.as_dict(),
               "grid_phases": phases.as_dict()}
    return PassReport("global_fusion", "applied", summary, details)


def _convs_left(horizontal: dict) -> str:
    n = horizontal.get("conv_groups_left", 0)
    return f" ({n} sibling conv group(s) left apart: TVM 0.27 has no CombineParallelConv2D)" if n else ""


def _vertical(mod: tvm.IRModule, g: KernelGraph, rules: KernelScheduler, timer: FusionTimer | None):
    """Fold layout copies, round by round without the groups refused in the last round (a
    refused reader leaves its copies to the others or to the producer's store)."""
    refused: dict[tuple[str, int], str] = {}
    timed: list[dict] = []
    for _ in range(MAX_ROUNDS):
        groups = _groups(g, set(refused))
        if not groups:
            return mod, [], refused, timed
        out = outline(mod, g, groups)
        merged = merged_kernels(out, g, groups)
        failed = _trial(g, groups, merged, rules)
        if timer and not failed:
            failed = _measure(g, groups, merged, timer, timed)
        if not failed:
            return out, groups, refused, timed
        refused.update(failed)
        timed.clear()
    return mod, [], refused, []


def _measure(g: KernelGraph, groups: list[Group], merged: list, timer: FusionTimer, timed: list) -> dict[int, str]:
    """Groups measured slower than the kernels they replace, by more than the timer resolves (a
    copy shared by k readers counts 1/k of its time for each): (kind, anchor) -> why."""
    failed = {}
    for grp, func in zip(groups, merged):
        parts = [(g.calls[i].prim, 1.0 if i == grp.anchor else 1.0 / max(len(g.consumers[i]), 1))
                 for i in grp.members if i in g.calls]
        why, entry = timer.verdict(func, parts, "layout copies")
        if why:
            failed[_kind(grp), grp.anchor] = f"{g.calls[grp.anchor].name} with copies folded {_kind(grp)} {why}"
        else:
            timed.append({"kernel": grp.name, **entry})
    return failed


def _kind(grp: Group) -> str:
    return "into reader" if grp.anchor in grp.outputs else "into producer"


def _groups(g: KernelGraph, refused: set[tuple[str, int]]) -> list[Group]:
    """Copies folded into their readers; copies left over, into their producer's store. A
    kernel refused as a reader may still take its output copy as a producer."""
    plan = fold_plan(g, {i for kind, i in refused if kind == "into reader"})
    folded = {i for chain in plan.values() for i in chain}
    groups = [Group(_name(g, [*chain, host]), (*chain, host), (host,), host) for host, chain in plan.items()]
    for producer, outs in epilogue_plan(g, folded).items():
        if ("into producer", producer) in refused or producer in plan:
            continue
        groups.append(Group(_name(g, [producer, *outs]), (producer, *outs), tuple(outs), producer))
    names: dict[str, int] = {}
    unique = []
    for grp in groups:                                    # one function name per group
        k = names[grp.name] = names.get(grp.name, -1) + 1
        unique.append(Group(f"{grp.name}_{k}" if k else grp.name, grp.members, grp.outputs, grp.anchor))
    return unique


def _name(g: KernelGraph, members: list[int]) -> str:
    parts = [g.calls[i].name.removeprefix("fused_") for i in members if i in g.calls]
    return ("gf_" + "_".join(parts))[:80]


def _label(g: KernelGraph, i: int) -> str:
    return f"{g.bindings[i].var.name}={g.calls[i].name}" if i in g.calls else g.bindings[i].var.name


def _trial(g: KernelGraph, groups: list[Group], merged: list, rules: KernelScheduler) -> dict[int, str]:
    """Groups whose merged kernel lost the schedule the grown kernel had: (kind, anchor) -> why."""
    failed = {}
    for grp, func in zip(groups, merged):
        if func is None:
            failed[_kind(grp), grp.anchor] = f"{grp.name}: not merged by FuseTIR"
            continue
        before, after = rules.rule(g.calls[grp.anchor].prim), rules.rule(func)
        if not keeps_schedule(before, after):
            failed[_kind(grp), grp.anchor] = f"{g.calls[grp.anchor].name} ({_kind(grp)}): {before} -> {after} when fused"
    return failed
