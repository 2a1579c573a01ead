"""Grid phases (GPU): a chain of kernels, each read only by the next, becomes one kernel whose
phases are separated by a grid-wide barrier (Souffle's global synchronization).

A matmul's output feeds the next matmul one-to-many: every block of the second needs rows that
many blocks of the first wrote, so no tile-level fusion joins them. With a grid barrier they run
as one cooperative kernel: the blocks stay resident, the tensor between them stays in L2, and
one launch and one kernel boundary go away per link. The chain is merged here (outline +
FuseTIR) with the phase boundaries recorded on the PrimFunc; the GPU schedule pass schedules
each phase as the kernel it was (schedule/phases.py), and the CUDA backend joins the phases'
device kernels into one cooperative kernel after checking that its grid can be co-resident
(codegen/cuda_grid.py).

Taken only where no thread is left idle by the merge: all phases run one block shape, so the
cooperative kernel's blocks are the phases' blocks. Where Gensor's best plans for two phases
differ, the cheaper phase takes the best plan with the other's block if Gensor's estimate says
that costs less than the link saves (LINK_SAVING_MS, a model constant). Chains are proposed from
the kernels' trial schedules and checked on the merged kernel cut into phases, as the schedule
pass will schedule it (a chain that does not fit whole is cut into runs that do). Chains stop
at MAX_PHASES kernels.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax

from ..schedule.contract import KernelScheduler
from ..schedule.phases import PHASE_ATTR, THREADS_ATTR, PhaseError, split_phases, thread_shape, top_blocks
from .graph import KernelGraph, kernel_graph
from .outline import Group, merged_kernels, outline

MAX_PHASES = 4
# What one link saves in this model: a kernel boundary (launch, drain, ramp-up; a few us even
# from a CUDA graph) minus a grid barrier (~1-2 us). Assumed, not measured here (no GPU).
LINK_SAVING_MS = 0.002


@dataclass
class GridPhases:
    chains: list[list[str]] = field(default_factory=list)     # member kernels of each chain taken
    refused: dict[str, str] = field(default_factory=dict)
    skipped: str = ""
    held: int = 0                                               # chains whose Gensor phases take one block

    def line(self) -> str:
        text = "grid phases (kernel chains as one cooperative kernel, a grid barrier between phases)"
        if self.skipped:
            return f"{text}: none ({self.skipped})"
        n = sum(len(c) for c in self.chains)
        text = f"{text}: {len(self.chains)} chain(s), {n} kernels -> {len(self.chains)}"
        if self.held:
            text += f", {self.held} with Gensor plans held to one block shape"
        if self.refused:
            reasons = sorted({why.split(" (")[0] for why in self.refused.values()})
            text += f" ({len(self.refused)} link(s) refused: {'; '.join(reasons)})"
        return text

    def as_dict(self) -> dict:
        return {"chains": self.chains, "refused": self.refused, "skipped": self.skipped, "held": self.held}


def grid_phases(mod: tvm.IRModule, rules: KernelScheduler) -> tuple[tvm.IRModule, GridPhases]:
    """Merge every chain of consecutive kernels that keeps its block shapes."""
    out = GridPhases()
    target = rules.target
    if rules.lacks("grid_phases"):
        out.skipped = rules.lacks("grid_phases")
        return mod, out
    if "sms" not in target.facts:
        out.skipped = f"no hardware table row for {target.sm}: co-residency cannot be checked"
        return mod, out
    g = kernel_graph(mod)
    if g is None:
        return mod, out
    chains = _chains(g, rules, out)
    for _ in range(MAX_PHASES):                    # again with the chains cut where they did not fit
        if not chains:
            return mod, out
        groups = [Group(_name(g, chain, k), tuple(chain), (chain[-1],), chain[-1]) for k, chain in enumerate(chains)]
        fused = outline(mod, g, groups)
        keep, threads = [], []
        for chain, func in zip(chains, merged_kernels(fused, g, groups)):
            runs, why = _segments(g, chain, func, rules)
            if why:
                out.refused[_label(g, chain)] = why
            keep += [members for members, _ in runs]
            threads += [held for _, held in runs]
        if keep == chains:
            out.chains = [[g.calls[i].name for i in chain] for chain in chains]
            out.held = sum(1 for t in threads if t)
            return _mark(fused, g, groups, chains, threads), out
        chains = keep
    return mod, out


def _chains(g: KernelGraph, rules, out: GridPhases) -> list[list[int]]:
    """Runs of calls where each call is read only by the next binding, a call, with the same
    block shape or a Gensor plan that may take the other's."""
    shapes: dict[int, tuple | None] = {}
    gensor: dict[int, bool] = {}

    def shape(i: int):
        if i not in shapes:
            func, rule, _ = rules.scheduled(g.calls[i].prim)
            shapes[i] = thread_shape(func) if func is not None and rule != "none" else None
            gensor[i] = rule == "gensor"
        return shapes[i]

    chains, current = [], []
    for a in sorted(g.calls):
        b = a + 1
        linked = (b in g.calls and g.consumers[a] == [b] and a not in g.returned
                  and isinstance(g.calls[a].var.ty, relax.TensorType))
        if linked and shape(a) != shape(b) and not (gensor[a] or gensor[b]):
            out.refused[_label(g, [a, b])] = f"block shapes differ ({_dims(shape(a))} vs {_dims(shape(b))})"
            linked = False
        elif linked and shape(a) is None:
            out.refused[_label(g, [a, b])] = "no single-launch schedule for the first kernel"
            linked = False
        if linked and len(current) < MAX_PHASES:
            current = current or [a]
            current.append(b)
            continue
        if current:
            chains.append(current)
        current = []
    return chains


def _segments(g: KernelGraph, chain: list[int], func, rules) -> tuple[list[tuple[list[int], int | None]], str]:
    """The merged kernel cut into phases as the schedule pass will cut it, split greedily into the
    longest runs (of 2 or more) that can share one block shape: [(members, Gensor's held thread
    count or None)], and why the chain was not taken whole."""
    if func is None:
        return [], "not merged by FuseTIR"
    sizes = [len(top_blocks(g.calls[i].prim)) for i in chain]
    try:
        phases, _ = split_phases(func.with_attr(PHASE_ATTR, sizes), sizes)
    except PhaseError as e:
        return [], f"cannot be cut into phases: {e}"
    runs, start = [], 0
    while start < len(phases) - 1:
        for end in range(len(phases), start + 1, -1):
            fits, held = _one_block(phases[start:end], rules)
            if fits:
                runs.append((chain[start:end], held))
                start = end
                break
        else:
            start += 1
    if len(runs) == 1 and len(runs[0][0]) == len(chain):
        return runs, ""
    scheduled = [rules.scheduled(p).func for p in phases]
    shapes = [thread_shape(f) if f is not None else None for f in scheduled]
    return runs, f"block shapes differ once cut into phases ({', '.join(_dims(s) for s in shapes)})"


def _one_block(phases: list, rules) -> tuple[bool, int | None]:
    """Whether the phases can run one block shape, and the thread count Gensor's phases are held
    to (None: their own best plans agree). The block is the one dlight's phases have (their rules
    cannot change it), else the costliest phase's; the others take Gensor's best plan with it
    while the estimated time that costs stays under LINK_SAVING_MS per link."""
    free = [rules.scheduled(p) for p in phases]
    shapes = [thread_shape(f) if f is not None else None for f, _, _ in free]
    if None in shapes:
        return False, None
    if len(set(shapes)) == 1:
        return True, None
    fixed = {s for s, (_, _, est) in zip(shapes, free) if est is None}
    if len(fixed) > 1:
        return False, None
    block = fixed.pop() if fixed else max(zip(shapes, free), key=lambda x: x[1][2])[0]
    if block[1:] != (1, 1):
        return False, None
    extra = 0.0
    for (_, _, est), p in zip(free, phases):
        held, _, held_est = rules.scheduled(p, block[0])
        if held is None or thread_shape(held) != block:
            return False, None
        extra += (held_est or 0.0) - (est or 0.0)
    return extra <= (len(phases) - 1) * LINK_SAVING_MS, block[0]


def _mark(mod: tvm.IRModule, g: KernelGraph, groups: list[Group], chains: list[list[int]],
          threads: list[int | None]) -> tvm.IRModule:
    """Record each merged kernel's phase sizes and held block (identical chains share one PrimFunc)."""
    merged = merged_kernels(mod, g, groups)
    for chain, func, held in zip(chains, merged, threads):
        attrs = {PHASE_ATTR: [len(top_blocks(g.calls[i].prim)) for i in chain]}
        if held:
            attrs[THREADS_ATTR] = held
        for gv, f in mod.functions_items():
            if f.same_as(func):
                mod.update_func(gv, f.with_attrs(attrs))
                break
    return mod


def _name(g: KernelGraph, chain: list[int], k: int) -> str:
    parts = [g.calls[i].name.removeprefix("fused_").removeprefix("gf_") for i in chain]
    return ("gp_" + "_".join(parts))[:72] + f"_{k}"


def _label(g: KernelGraph, chain: list[int]) -> str:
    return " -> ".join(f"{g.bindings[i].var.name}={g.calls[i].name}" for i in chain)


def _dims(shape) -> str:
    return "x".join(map(str, shape)) if shape else "?"
