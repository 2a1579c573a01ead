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

Taken only where no thread is left idle by the merge: every phase must keep the block shape it
has as a kernel of its own (the trial schedule says), so the cooperative kernel's blocks are the
phases' blocks. Chains stop at MAX_PHASES kernels.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax

from ..schedule.phases import PHASE_ATTR, PhaseError, split_phases, thread_shape, top_blocks
from .graph import KernelGraph, kernel_graph
from .outline import Group, merged_kernels, outline

MAX_PHASES = 4


@dataclass
class GridPhases:
    chains: list[list[str]] = field(default_factory=list)     # member kernels of each chain taken
    refused: dict[str, str] = field(default_factory=dict)
    skipped: str = ""

    def line(self) -> str:
        text = "grid phases (kernel chains as one cooperative kernel, a grid barrier between phases)"
        if self.skipped:
            return f"{text}: none ({self.skipped})"
        n = sum(len(c) for c in self.chains)
        text = f"{text}: {len(self.chains)} chain(s), {n} kernels -> {len(self.chains)}"
        if self.refused:
            reasons = sorted({why.split(" (")[0] for why in self.refused.values()})
            text += f" ({len(self.refused)} link(s) refused: {'; '.join(reasons)})"
        return text

    def as_dict(self) -> dict:
        return {"chains": self.chains, "refused": self.refused, "skipped": self.skipped}


def grid_phases(mod: tvm.IRModule, target, rules) -> tuple[tvm.IRModule, GridPhases]:
    """Merge every chain of consecutive kernels that keeps its block shapes."""
    out = GridPhases()
    if target.kind != "cuda":
        out.skipped = "GPU targets only: a CPU kernel's threads meet at the end of its parallel loop"
        return mod, out
    if "sms" not in target.facts:
        out.skipped = f"no hardware table row for {target.sm}: co-residency cannot be checked"
        return mod, out
    g = kernel_graph(mod)
    if g is None:
        return mod, out
    chains = _chains(g, rules, out)
    for _ in range(2):                             # a second round without the chains refused
        if not chains:
            return mod, out
        groups = [Group(_name(g, chain, k), tuple(chain), (chain[-1],), chain[-1]) for k, chain in enumerate(chains)]
        fused = outline(mod, g, groups)
        keep = []
        for chain, func in zip(chains, merged_kernels(fused, g, groups)):
            why = _split_refusal(g, chain, func)
            if why:
                out.refused[_label(g, chain)] = why
            else:
                keep.append(chain)
        if len(keep) == len(chains):
            out.chains = [[g.calls[i].name for i in chain] for chain in chains]
            return _mark(fused, g, groups, chains), out
        chains = keep
    return mod, out


def _chains(g: KernelGraph, rules, out: GridPhases) -> list[list[int]]:
    """Runs of calls where each call is read only by the next binding, a call, with the same
    block shape."""
    shapes: dict[int, tuple | None] = {}

    def shape(i: int):
        if i not in shapes:
            func, rule = rules.gpu_schedule(g.calls[i].prim)
            shapes[i] = thread_shape(func) if func is not None and rule != "none" else None
        return shapes[i]

    chains, current = [], []
    for a in sorted(g.calls):
        b = a + 1
        linked = (b in g.calls and g.consumers[a] == [b] and a not in g.returned
                  and isinstance(g.calls[a].var.ty, relax.TensorType))
        if linked and shape(a) != shape(b):
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


def _split_refusal(g: KernelGraph, chain: list[int], func) -> str:
    if func is None:
        return "not merged by FuseTIR"
    sizes = [len(top_blocks(g.calls[i].prim)) for i in chain]
    try:
        split_phases(func.with_attr(PHASE_ATTR, sizes), sizes)
    except PhaseError as e:
        return f"cannot be cut into phases: {e}"
    return ""


def _mark(mod: tvm.IRModule, g: KernelGraph, groups: list[Group], chains: list[list[int]]) -> tvm.IRModule:
    """Record each merged kernel's phase sizes (identical chains share one PrimFunc)."""
    merged = merged_kernels(mod, g, groups)
    for chain, func in zip(chains, merged):
        sizes = [len(top_blocks(g.calls[i].prim)) for i in chain]
        for gv, f in mod.functions_items():
            if f.same_as(func):
                mod.update_func(gv, f.with_attr(PHASE_ATTR, sizes))
                break
    return mod


def _name(g: KernelGraph, chain: list[int], k: int) -> str:
    parts = [g.calls[i].name.removeprefix("fused_").removeprefix("gf_") for i in chain]
    return ("gp_" + "_".join(parts))[:72] + f"_{k}"


def _label(g: KernelGraph, chain: list[int]) -> str:
    return " -> ".join(f"{g.bindings[i].var.name}={g.calls[i].name}" for i in chain)


def _dims(shape) -> str:
    return "x".join(map(str, shape)) if shape else "?"
