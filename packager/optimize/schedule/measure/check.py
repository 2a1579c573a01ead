"""Schedules chosen without timing, checked on this machine before they ship.

A measured build runs every candidate and drops one whose output differs from the reference
(timing.py). A target whose schedules are chosen without timing (`measure: false`, an arm64
target built on x86, every target without an RPC device) had no such check, and a wrong schedule
shipped: the schedule, not the ISA, is what goes wrong. So each scheduled kernel is compiled for
this host beside its unscheduled TIR (the loops the schedule pass started from), both run on the
same seeded inputs, and a kernel that disagrees falls back to the next candidate the pass offers,
down to the unscheduled loops themselves."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import tvm
import tvm_ffi
from tvm import ir, tirx
from tvm.target import codegen

from ....targets.host import host_cpu_flags, host_cpu_name
from .agree import agree, rounds_through_half
from .compile import Library, build_library
from .timing import _args

@dataclass
class CheckReport:
    """What the check did, for the schedule pass's line and details."""

    checked: int = 0
    unchecked: dict[str, str] = field(default_factory=dict)       # kernel -> why (compile or run failed)
    fell_back: dict[str, str] = field(default_factory=dict)       # kernel -> "from X to Y"

    def summary(self) -> str:
        text = f"{self.checked} untimed schedules checked against their unscheduled loops on this machine"
        if self.fell_back:
            text += (f", {len(self.fell_back)} disagreed and fell back ("
                     + "; ".join(f"{k}: {v}" for k, v in self.fell_back.items()) + ")")
        if self.unchecked:
            text += f", {len(self.unchecked)} could not be run here"
        return text

    def details(self) -> dict:
        return {"checked": self.checked, "fell_back": self.fell_back, "unchecked": self.unchecked}


# LLVM intrinsics a schedule calls by name (rules/int_dot.py, rules/tile_dot.py) -> the CPU flag they need. LLVM
# aborts the process when it cannot lower one for this machine, so such a kernel is left unchecked.
INTRINSIC_FLAGS = (("llvm.x86.tdpbf16ps", "amx_bf16"), ("llvm.x86.tdpbusd", "amx_int8"), ("llvm.x86.tile", "amx_tile"), ("llvm.x86.ldtilecfg", "amx_tile"),
                   ("llvm.x86.avx512.vpdpbusd", "avx512_vnni"), ("llvm.x86.avx512.", "avx512f"),
                   ("llvm.x86.avx2.", "avx2"))


def _lacks(func: tirx.PrimFunc) -> str | None:
    """The CPU flag a kernel's named intrinsics need that this machine lacks (None: it has them)."""
    names: set[str] = set()

    def visit(call: ir.Call) -> None:
        if getattr(call.op, "name", "") in ("tirx.call_llvm_pure_intrin", "tirx.call_llvm_intrin"):
            first = call.args[0]
            names.add(codegen.llvm_get_intrinsic_name(int(first)) if isinstance(first, tirx.IntImm) else str(first))
    tvm_ffi.structural_walk(func.body, (ir.Call, visit), order="post")
    flags = host_cpu_flags()
    return next((flag for prefix, flag in INTRINSIC_FLAGS
                 if flag not in flags and any(n.startswith(prefix) for n in names)), None)


def _host_build(funcs: dict[str, tirx.PrimFunc]) -> Library:
    """For this CPU by name: an x86 kernel may call AVX2 intrinsics (rules/int_dot.py), which LLVM
    cannot lower for its generic x86-64 (it aborts the process)."""
    return build_library(funcs, tvm.target.Target({"kind": "llvm", "mcpu": host_cpu_name()}))


def disagreements(pairs: dict[str, tuple[tirx.PrimFunc, tirx.PrimFunc]]) -> dict[str, bool | str]:
    """For each kernel's (scheduled, unscheduled) pair: True if they disagree on seeded inputs,
    False if they agree, or why they could not be run. All pairs are compiled in one module."""
    lacking = {n: f"uses {flag} instructions, which this machine lacks" for n, (s, _) in pairs.items()
               if (flag := _lacks(s))}
    pairs = {n: p for n, p in pairs.items() if n not in lacking}
    if not pairs:
        return lacking
    funcs = {}
    for i, (sched, ref) in enumerate(pairs.values()):
        funcs[f"s{i}"], funcs[f"r{i}"] = sched, ref
    try:
        lib = _host_build(funcs)
    except Exception:  # noqa: BLE001 - one kernel that does not compile here: check them one by one
        return lacking | ({n: _one(n, s, r) for n, (s, r) in pairs.items()} if len(pairs) > 1 else
                          {n: "does not compile for this machine" for n in pairs})
    return lacking | {name: _run_pair(lib, f"s{i}", f"r{i}", ref) for i, (name, (_, ref)) in enumerate(pairs.items())}


def _one(name: str, sched: tirx.PrimFunc, ref: tirx.PrimFunc) -> bool | str:
    return disagreements({name: (sched, ref)})[name]


def _run_pair(lib, sched: str, ref_name: str, ref: tirx.PrimFunc) -> bool | str:
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    args = _args(ref, rng, dev)
    inputs = [a.numpy() for a in args]
    try:
        lib[ref_name](*args)
        want = [a.numpy() for a in args]
        for a, x in zip(args, inputs):
            a.copyfrom(x)
        lib[sched](*args)
        got = [a.numpy() for a in args]
    except Exception as e:  # noqa: BLE001 - a kernel that fails to run here is reported, not trusted
        lines = str(e).strip().splitlines()
        return f"failed to run: {lines[-1][:120] if lines else type(e).__name__}"
    half = rounds_through_half(ref)
    return not all(agree(g, w, half) for g, w in zip(got, want))


Candidates = Callable[[str, tirx.PrimFunc], Iterator[tuple[tirx.PrimFunc, str]]]


def check_untimed(scheduled: dict[str, tirx.PrimFunc], unscheduled: dict[str, tirx.PrimFunc],
                  labels: dict[str, str], fallbacks: Candidates) -> tuple[dict[str, tirx.PrimFunc], CheckReport]:
    """The kernels to ship: each scheduled kernel that agrees with its unscheduled loops, or the
    first of `fallbacks(name, unscheduled)` (candidate, label) that does; the unscheduled loops
    themselves when none does. `labels` names each kernel's current schedule for the report."""
    report = CheckReport()
    out = dict(scheduled)
    verdicts = disagreements({n: (scheduled[n], unscheduled[n]) for n in scheduled})
    for name, verdict in verdicts.items():
        if isinstance(verdict, str):
            report.unchecked[name] = verdict
            continue
        report.checked += 1
        if not verdict:
            continue
        chosen, label = unscheduled[name], "unscheduled loops"
        for cand, cand_label in fallbacks(name, unscheduled[name]):
            if _one(name, cand, unscheduled[name]) is False:
                chosen, label = cand, cand_label
                break
        out[name] = chosen
        report.fell_back[name] = f"{labels.get(name, 'schedule')} -> {label}"
    return out, report
