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
from tvm import tirx

from ....targets.host import host_cpu_name
from .compile import Library, build_library
from .timing import _args

RTOL = 1e-4            # of the reference tensor's largest finite |value|: blocked fp32 sums reorder
# A reordered fp32 sum rounded to fp16 can land one fp16 step (2^-11 of the value) away.
RTOL_BY_DTYPE = {"float16": 2e-3}
STEP_FLIPS = 0.01      # of an 8-bit output's elements that may be one quantization step off


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


def _host_build(funcs: dict[str, tirx.PrimFunc]) -> Library:
    """For this CPU by name: an x86 kernel may call AVX2 intrinsics (rules/int_dot.py), which LLVM
    cannot lower for its generic x86-64 (it aborts the process)."""
    return build_library(funcs, tvm.target.Target({"kind": "llvm", "mcpu": host_cpu_name()}))


def _agree(got: np.ndarray, ref: np.ndarray) -> bool:
    """Equal for integers, except that an 8-bit output (a QuantizeLinear's) may be one step off in
    up to STEP_FLIPS of its elements: a reordered float sum just below a rounding boundary lands
    one step over (QDQ BERT's softmax and layer-norm kernels fell back to slower schedules on it).
    For floats within RTOL (fp16: RTOL_BY_DTYPE) of the reference's largest finite |value|, with
    NaN where it has NaN and the same infinities."""
    if got.dtype.kind != "f":
        if got.dtype.itemsize != 1 or got.dtype == np.bool_:
            return np.array_equal(got, ref)
        off = np.abs(got.astype(np.int16) - ref.astype(np.int16))
        return bool(off.max(initial=0) <= 1 and np.count_nonzero(off) <= STEP_FLIPS * off.size)
    finite = np.abs(ref[np.isfinite(ref)].astype(np.float64))
    scale = float(finite.max()) if finite.size else 0.0
    atol = RTOL_BY_DTYPE.get(str(ref.dtype), RTOL) * (scale or 1.0) + 1e-6
    return bool(np.allclose(got.astype(np.float64), ref.astype(np.float64), rtol=0.0, atol=atol, equal_nan=True))


def disagreements(pairs: dict[str, tuple[tirx.PrimFunc, tirx.PrimFunc]]) -> dict[str, bool | str]:
    """For each kernel's (scheduled, unscheduled) pair: True if they disagree on seeded inputs,
    False if they agree, or why they could not be run. All pairs are compiled in one module."""
    if not pairs:
        return {}
    funcs = {}
    for i, (sched, ref) in enumerate(pairs.values()):
        funcs[f"s{i}"], funcs[f"r{i}"] = sched, ref
    try:
        lib = _host_build(funcs)
    except Exception:  # noqa: BLE001 - one kernel that does not compile here: check them one by one
        return {n: _one(n, s, r) for n, (s, r) in pairs.items()} if len(pairs) > 1 else \
            {n: "does not compile for this machine" for n in pairs}
    return {name: _run_pair(lib, f"s{i}", f"r{i}", ref) for i, (name, (_, ref)) in enumerate(pairs.items())}


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
    return not all(_agree(g, w) for g, w in zip(got, want))


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
