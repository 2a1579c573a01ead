"""`pack build`: spec -> package. `build` is the whole pipeline, one named stage per line:

1. check the spec and the model (nothing is compiled before every input problem is reported)
2. split into units: the whole model, or (partial offload) compiled parts + nodes left to ONNX Runtime
3. per unit and shape profile: import + graph passes + kernel graph (codegen/compile.py)
4. the C++ runtime and ONNX Runtime custom-op library for each CPU architecture (cached)
5. per unit and target: kernel passes, the backend's kernel artifact, weights.bin, plan.json;
   then the runtimes, the ORT wrapper model, README, build report and manifest, and the finished
   package moves into place (a failed build leaves nothing half-written)
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Callable

import onnx

from . import __version__
from .codegen.backend import backend_for
from .codegen.compile import compile_unit, optimize_unit
from .emit.manifest import WRAPPER_MODEL, package_manifest, sha256_file, unit_manifest
from .emit.ort_headers import ort_headers
from .emit.ort_wrapper import wrapper_for
from .emit.package import PackageWriter, check_destination
from .emit.readme import package_readme
from .emit.reference import REFERENCE_FILE, References, compute_references, write_reference
from .emit.report import build_report
from .tools.report import write as write_html_report
from .emit.runtime import build_runtime, bundle_runtimes
from .errors import UserError
from .frontend import (bind_profiles, check_configurations, check_operators, load_model, profile_shapes,
                       random_inputs, without_static_control_flow)
from .frontend.opset import check_conversion, check_onnxruntime_knows
from .frontend.lowering import describe_lowered
from .frontend.units import split_units
from .frontend.model import check_kernel_shapes, weight_bytes
from .frontend.sizes import check_sizes
from .optimize.schedule.measure import BUSY_CORES, TALLY, busy_cores, with_cold_weights
from .spec import Spec
from .targets import host_arch, resolve_all

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


def build(spec: Spec, only_targets: list[str] | None = None, log: Log = print, bundle_runtime: bool = True) -> Path:
    """Build the package described by `spec`; returns the package folder. Without
    `bundle_runtime` the package holds only its compiled targets (for tools that bring the
    runtime themselves, like the conformance runner)."""
    t_start, st = time.perf_counter(), Stages(log)
    timed_before = replace(TALLY)
    log(f"pack build {spec.name}: {spec.model.name} -> {spec.output}")
    model, dtypes, targets = st.run("check spec and model", check_inputs, spec, only_targets)
    weights = weight_bytes(model.proto)
    targets = with_cold_weights(targets, weights)
    cold = [t.name for t in targets if getattr(t, "cold_weights", False)]
    if cold:
        log(f"  weights ({weights / 1e6:.0f} MB) exceed the last-level cache: candidates timed "
            f"with the caches flushed ({', '.join(cold)})")
    if model.conversion is not None:
        log(f"  {model.conversion.summary()}")
    _log_control_flow(log, model.control_flow)
    units, split, types = st.run("partition for ONNX Runtime" if spec.onnxruntime.partial else "plan", split_units,
                                 spec, model, dtypes)
    _log_offload(log, model, split)
    st.run(f"import + graph passes ({len(units)} unit(s), {len(spec.profiles)} profile(s))",
           lambda: [optimize_unit(u, spec.optimize, targets) for u in units])
    arches = sorted({t.arch for t in targets}, key=lambda a: a != host_arch()) if bundle_runtime else []
    runtimes = {a: st.run(f"C++ runtime for {a}", build_runtime, a, log) for a in arches}
    refs = st.run("reference data (onnxruntime)", compute_references, spec, model, dtypes, units, split) \
        if bundle_runtime else References([], 0, "the package has no runtime to check itself with")
    log(f"  {refs.summary()}")
    stored = {r.rel: r for r in refs.units}
    model_sha = sha256_file(spec.model)
    ids = {u.name: _package_id(spec, model_sha, u.name) for u in units}
    pins: dict[str, str] = {}      # unit name -> sha256 of the manifest its PackagedModel node opens
    with PackageWriter(spec.output) as w:
        for u in units:
            compile_unit(u, targets, spec.optimize, w, log)
            if u.rel in stored:
                write_reference(w, stored[u.rel], spec.verify.rtol, spec.verify.atol)
            if u.rel:
                manifest = unit_manifest(spec, u, targets, ids[u.name]) | _reference_entry(u.rel, stored)
                pins[u.name] = w.write_manifest(manifest, under=u.rel)
        if split is not None and "" in stored:
            write_reference(w, stored[""], spec.verify.rtol, spec.verify.atol)
        runtime, ort_libs = bundle_runtimes(w, runtimes) if bundle_runtime else ({}, {})
        w.write_text("README.md", package_readme(spec, model, targets, ort_libs, split is not None))
        ort_note = "" if ort_libs or not bundle_runtime else f"custom-op library not built: {ort_headers()[1]}"
        measured = {"programs": TALLY.programs - timed_before.programs,
                    "seconds": round(TALLY.seconds - timed_before.seconds, 3)}
        busy = busy_cores(timed_before, TALLY)
        if busy is not None:
            measured.update(busy_cores=round(busy, 2), busy=busy >= BUSY_CORES)
        w.write_json("build_report.json", build_report(spec, model, units, split, st.times,
                                                       time.perf_counter() - t_start, ort_note, refs.summary(), measured))
        root_sha = w.write_manifest(package_manifest(spec, model, dtypes, units, split, targets,
                                                     _package_id(spec, model_sha), model_sha, runtime, ort_libs)
                                    | _reference_entry("", stored))
        pins.update({u.name: root_sha for u in units if not u.rel})
        # Written after the manifest, which it pins (so the manifest does not list it).
        onnx.save(wrapper_for(model, units, split, ids, pins, types), str(w.path(WRAPPER_MODEL)))
        st.run("report.html (graph, roofline, passes)", write_html_report, w.root)   # a view, not a package file
        out = w.finish()
    _log_passes(log, units, ort_note)
    timed = (f"; {measured['programs']} candidate programs timed, {measured['seconds']:.1f} s of it"
             if measured["programs"] else "")
    if measured.get("busy"):
        log(f"  the machine was busy while candidates were timed: other processes kept {measured['busy_cores']:.1f} "
            f"of {os.cpu_count()} cores busy on average, so the choices may differ from a quiet machine's; "
            f"rebuild on a quiet machine (or into an empty tuning database) for the package's best speed")
    log(f"wrote {out} ({time.perf_counter() - t_start:.1f} s{timed})")
    return out


def _reference_entry(rel: str, stored: dict) -> dict:
    """The manifest's `reference` field of the (sub-)package at `rel`, when it has reference data."""
    return {"reference": REFERENCE_FILE} if rel in stored else {}


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
    for kind in dict.fromkeys(t.kind for t in targets):
        backend_for(kind).check_toolchain([t for t in targets if t.kind == kind])
    check_destination(spec.output)
    return model, dtypes, targets


def _package_id(spec: Spec, model_sha: str, part: str = "") -> str:
    """Identifies one build of one part (the ORT op checks it opened the package it was built with)."""
    key = json.dumps([model_sha, spec.raw, __version__, part], sort_keys=True, default=str)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _log_offload(log: Log, model, split) -> None:
    """One line for the split and, when nodes stay in ONNX Runtime, a warning naming their ops: the
    package then needs ONNX Runtime for the whole model (packrt-run runs each part alone)."""
    if split is not None:
        kept = sorted({model.proto.graph.node[k].op_type for k in split.kept})
        log(f"  partial offload: {len(split.parts)} compiled part(s), {len(split.kept)} node(s) stay in "
            f"ONNX Runtime ({', '.join(kept)})")
        log(f"  warning: {', '.join(kept)} run in ONNX Runtime, not compiled: deploy the package through "
            f"ort/model.onnx; `onnxruntime: {{fallback: false}}` in the spec makes this an error instead")


def _log_control_flow(log: Log, flow) -> None:
    """What happened to If/Loop: taken out (static under every profile), or why one stays."""
    if flow is None:
        return
    if flow.inlined:
        log(f"  frontend: {flow.summary()} (static under every profile)")
    for node, why in flow.kept.items():
        log(f"  {node} stays in ONNX Runtime: {why}")


def _log_passes(log: Log, units, ort_note: str) -> None:
    first = [next(iter(u.imports.values())) for u in units if u.imports]
    notes = sorted({s.note for s in first if s.note})
    lowered = sum((Counter(s.lowered) for s in first), Counter())
    lowered_note = f"; lowered {describe_lowered(dict(lowered))}" if lowered else ""
    log(f"  frontend: onnxruntime folded {sum(s.folded for s in first)} node(s) to constants, our rewrites changed "
        f"{sum(s.rewritten for s in first)} (first profile){lowered_note}{''.join(f'; {n}' for n in notes)}")
    for p in units[0].graph_passes:
        log(f"  pass {p.name}: {p.status}: {p.summary}")
    for tr in units[0].target_reports:
        for p in tr["kernel_passes"]:
            log(f"  pass {p['pass']} [{tr['name']}]: {p['status']}: {p['summary']}")
    if ort_note:
        log(f"  warning: ONNX Runtime {ort_note}")
