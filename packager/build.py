"""`pack build`: spec -> package. `build` is the whole pipeline, one named stage per line, each
returning what the next takes:

1. check the spec and the model (nothing is compiled before every input problem is reported)
2. split into units: the whole model, or (partial offload) compiled parts + nodes left to ONNX Runtime
3. per unit and shape profile: import + graph passes + kernel graph (codegen/compile.py)
4. the C++ runtime and ONNX Runtime custom-op library for each CPU architecture (cached), and
   onnxruntime's reference outputs
5. per unit and target: kernel passes, the backend's kernel artifact, weights.bin, plan.json;
   then emit/assemble.py writes references, manifests, runtimes, README, build report and the ORT
   wrapper model, and the finished package moves into place (a failed build leaves nothing
   half-written). What timing costs is counted in one Tally, made here and handed down.
"""
from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from .codegen.backend import check_toolchains
from .codegen.compile import PER_TARGET_REPORTS, compile_unit, optimize_unit
from .emit.assemble import Build, CompiledUnit, write_package, write_units
from .emit.html import write as write_html_report
from .emit.package import PackageWriter, check_destination, check_space
from .emit.reference import References, compute_references
from .emit.runtime import build_runtime
from .errors import UserError
from .frontend import (bind_profiles, check_configurations, check_operators, load_model, profile_shapes,
                       random_inputs, without_static_control_flow)
from .frontend.lowering import describe_lowered
from .frontend.model import check_kernel_shapes, weight_bytes
from .frontend.opset import check_conversion, check_onnxruntime_knows
from .frontend.sizes import check_sizes
from .frontend.units import split_units
from .optimize.schedule.contract import Tally
from .optimize.schedule.registry import scheduler_for
from .spec import Spec
from .targets import Target, host_arch, resolve_all

Log = Callable[[str], None]


class Stages:
    """Prints one line per finished stage with its duration."""

    def __init__(self, log: Log):
        self.log = log
        self.times: dict[str, float] = {}

    def run(self, name: str, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        self.times[name] = round(time.perf_counter() - t0, 3)
        self.log(f"  {name} ({self.times[name]:.1f} s)")
        return out


def build(spec: Spec, only_targets: list[str] | None = None, log: Log = print, bundle_runtime: bool = True,
          html_report: bool = True) -> Path:
    """Build the package described by `spec`; returns the package folder. Without
    `bundle_runtime` the package holds only its compiled targets (for tools that bring the
    runtime themselves, like the conformance runner); without `html_report` it has no
    report.html (its roofline plot costs 0.25 s, a fifth of a one-operator build)."""
    budget = 0.0 if spec.optimize.tunes() else spec.optimize.budget         # the measured tuner has its own
    t_start, st, tally = time.perf_counter(), Stages(log), Tally(budget_s=budget)
    log(f"pack build {spec.name}: {spec.model.name} -> {spec.output}")
    model, dtypes, targets = st.run("check spec and model", check_inputs, spec, only_targets)
    targets = timed_cold(targets, weight_bytes(model.proto), log)
    _log_frontend(log, model)
    units, split, types = st.run("partition for ONNX Runtime" if spec.onnxruntime.partial else "plan", split_units,
                                 spec, model, dtypes)
    _log_offload(log, model, split)
    optimized = st.run(f"import + graph passes ({len(units)} unit(s), {len(spec.profiles)} profile(s))",
                       lambda: [optimize_unit(u, spec.optimize, targets, tally) for u in units])
    runtimes = {a: st.run(f"C++ runtime for {a}", build_runtime, a, log) for a in runtime_arches(targets)} \
        if bundle_runtime else None
    refs = st.run("reference data (onnxruntime)", compute_references, spec, model, dtypes, units, split) \
        if bundle_runtime else References([], 0, "the package has no runtime to check itself with")
    log(f"  {refs.summary()}")
    made = Build(spec, model, dtypes, targets, split, types, refs)
    with PackageWriter(spec.output) as w:
        compiled = [compile_unit(u, targets, spec.optimize, w, log, tally) for u in optimized]
        pins = write_units(w, made, compiled)
        ort_note = write_package(w, made, compiled, pins, runtimes, {
            "stage_times": st.times, "seconds": time.perf_counter() - t_start, "measured": tally.summary()})
        if html_report:                                                            # a view, not a package file
            st.run("report.html (graph, roofline, passes)", write_html_report, w.root)
        out = w.finish()
    _log_passes(log, compiled, ort_note)
    _log_time(log, st.times, compiled, tally)
    _log_finish(log, out, tally, time.perf_counter() - t_start)
    return out


def timed_cold(targets: list[Target], weights: int, log: Log) -> list[Target]:
    """The targets, those whose candidates are timed marked to be timed with the caches flushed
    when the model's weights exceed their last-level cache (said in the log)."""
    targets = [scheduler_for(t).with_cold_weights(weights) for t in targets]
    cold = [t.name for t in targets if getattr(t, "cold_weights", False)]
    if cold:
        log(f"  weights ({weights / 1e6:.0f} MB) exceed the last-level cache: candidates timed "
            f"with the caches flushed ({', '.join(cold)})")
    return targets


def runtime_arches(targets: list[Target]) -> list[str]:
    """The CPU architectures the package's runtimes are built for (this host's first)."""
    return sorted({t.arch for t in targets}, key=lambda a: a != host_arch())


def check_inputs(spec: Spec, only_targets: list[str] | None):
    """Everything about the input that can be wrong, before anything is compiled: the model (and
    its conversion into the supported opsets), its shapes under the spec's profiles, the targets
    and their toolchains, and an output folder that can take the package."""
    model = load_model(spec.model)
    dtypes = bind_profiles(spec, model)
    check_kernel_shapes(model)
    check_sizes(spec, model, dtypes)
    if model.conversion is not None:
        shapes = profile_shapes(model, spec.profiles[0])
        try:
            inputs = random_inputs(model, shapes, dtypes, values=spec.verify.inputs)
        except MemoryError:
            raise UserError(f"{spec.model}: not enough memory for test inputs of shapes {shapes} to check the "
                            f"opset {model.conversion.source} -> {model.conversion.target} conversion; give smaller "
                            "shapes in the spec, or re-export the model at a supported opset") from None
        check_conversion(spec.model, model.proto, inputs, model.conversion, spec.verify.rtol, spec.verify.atol)
    model = without_static_control_flow(model, [profile_shapes(model, p) for p in spec.profiles])
    if not spec.onnxruntime.partial:
        check_operators(model)
        check_configurations(model)
    else:
        check_onnxruntime_knows(model.proto, spec.model)
    targets = resolve_all(spec, only_targets)
    check_toolchains(targets)
    check_destination(spec.output)
    check_space(spec.output, weight_bytes(model.proto) * len(targets))
    return model, dtypes, targets


def _log_offload(log: Log, model, split) -> None:
    """One line for the split and, when nodes stay in ONNX Runtime, a warning naming their ops: the
    package then needs ONNX Runtime for the whole model (packrt-run runs each part alone)."""
    if split is not None:
        kept = sorted({model.proto.graph.node[k].op_type for k in split.kept})
        log(f"  partial offload: {len(split.parts)} compiled part(s), {len(split.kept)} node(s) stay in "
            f"ONNX Runtime ({', '.join(kept)})")
        log(f"  warning: {', '.join(kept)} run in ONNX Runtime, not compiled: deploy the package through "
            f"ort/model.onnx; `onnxruntime: {{fallback: false}}` in the spec makes this an error instead")


def _log_frontend(log: Log, model) -> None:
    """The opset conversion, and what happened to If/Loop: taken out (static under every profile),
    or why one stays."""
    if model.conversion is not None:
        log(f"  {model.conversion.summary()}")
    flow = model.control_flow
    if flow is None:
        return
    if flow.inlined:
        log(f"  frontend: {flow.summary()} (static under every profile)")
    for node, why in flow.kept.items():
        log(f"  {node} stays in ONNX Runtime: {why}")


def _log_passes(log: Log, units: list[CompiledUnit], ort_note: str) -> None:
    first = [next(iter(u.imports.values())) for u in units if u.imports]
    notes = sorted({s.note for s in first if s.note})
    lowered = sum((Counter(s.lowered) for s in first), Counter())
    lowered_note = f"; lowered {describe_lowered(dict(lowered))}" if lowered else ""
    pads, conv1d = sum(s.pads_folded for s in first), sum(s.conv1d_as_2d for s in first)
    simplify_note = (f"; {pads} zero Pad(s) folded into the Conv reading them (pass simplify)" if pads else "") + \
        (f"; {conv1d} 1-D Conv(s) as 2-D over height 1 (pass simplify)" if conv1d else "")
    log(f"  frontend: onnxruntime folded {sum(s.folded for s in first)} node(s) to constants, our rewrites changed "
        f"{sum(s.rewritten for s in first)} (first profile){lowered_note}{simplify_note}{''.join(f'; {n}' for n in notes)}")
    for p in units[0].graph_passes:
        log(f"  pass {p.name}: {p.status}: {p.summary}")
    for tr in units[0].target_reports:
        for p in tr["kernel_passes"]:
            log(f"  pass {p['pass']} [{tr['name']}]: {p['status']}: {p['summary']}")
    if ort_note:
        log(f"  warning: ONNX Runtime {ort_note}")


def _log_time(log: Log, stages: dict[str, float], units: list[CompiledUnit], tally: Tally) -> None:
    """Where the build's time went: each stage (the graph passes of the first unit, profile and
    target in brackets), each target's kernel passes and code generation, and how much of it was
    timing candidates."""
    def parts(items) -> str:
        shown = [f"{name} {sec:.1f}" for name, sec in items if sec >= 0.05]
        return f" [{', '.join(shown)}]" if shown else ""

    first = units[0].target_reports[0]["kernel_passes"] if units[0].target_reports else []
    graph = [(p.name, p.seconds) for p in units[0].graph_passes] + \
        [(p["pass"], p["seconds"]) for p in first if p["pass"] in PER_TARGET_REPORTS]
    targets = []
    for u in units:
        for row in u.target_reports:
            passes = [(p["pass"], p["seconds"]) for p in row["kernel_passes"] if p["pass"] not in PER_TARGET_REPORTS]
            rest = row["seconds"] - sum(sec for _, sec in passes)
            targets.append(f"{row['name']}{f' ({u.name})' if u.name else ''} {row['seconds']:.1f}"
                           f"{parts(passes + [('codegen, plan, weights', rest)])}")
    cells = []
    for name, sec in stages.items():
        if name.startswith("report.html"):
            cells, targets = cells + targets, []                 # the targets were compiled before the page
        detail = parts(graph) if name.startswith("import") else ""
        cells.append(f"{name.split(' (')[0]} {sec:.1f}{detail}")
    cells += targets
    timing = f"; timing candidates {tally.seconds:.1f} s of it" if tally.programs else ""
    log(f"  where the time went (s): {'; '.join(cells)}{timing}")


def _log_finish(log: Log, out: Path, tally: Tally, seconds: float) -> None:
    """The last line (what timing cost), after a warning when the machine was busy while timing."""
    measured = tally.summary()
    if measured.get("busy"):
        log(f"  the machine was busy while candidates were timed: other processes kept {measured['busy_cores']:.1f} "
            f"of {os.cpu_count()} cores busy on average, so the choices may differ from a quiet machine's; "
            f"rebuild on a quiet machine (or into an empty tuning database) for the package's best speed")
    notes = ([f"{tally.screened} slow ones not timed past their first run"] if tally.screened else []) + (
        [f"timing budget of {tally.budget_s:.0f} s spent: {tally.cut} choices made on one repeat per candidate "
         "(optimize.tuning.budget)"] if tally.cut else [])
    screened = f" ({'; '.join(notes)})" if notes else ""
    timed = f"; {tally.programs} candidate programs timed{screened}, {tally.seconds:.1f} s of it" if tally.programs else ""
    log(f"wrote {out} ({seconds:.1f} s{timed})")
