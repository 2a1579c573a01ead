"""`pack build`: spec -> package. The stages, in order, each reported with its time:

1. spec and model checks (nothing is compiled before every input problem is reported), and, for
   partial offload, the split into compiled parts and nodes left to ONNX Runtime
2. per part and shape profile: import, graph passes, kernel graph (packager/compile.py)
3. the C++ runtime and ONNX Runtime custom-op library for each CPU architecture (cached)
4. per part and target: kernels.so, weights.bin, plan.json; then the ORT wrapper model,
   sources, README, build report and manifest, and the finished package moves into place
"""
from __future__ import annotations

import hashlib
import json
import shutil
import string
import time
from pathlib import Path
from typing import Callable

import onnx

from . import __version__
from .compile import Unit, compile_unit, lower, profiles_manifest, targets_manifest
from .cuda_codegen import check_cuda_toolchain
from .emit.ort_wrapper import PackagedNode, wrapper_model
from .emit.package import PackageWriter, sha256_file
from .errors import UserError
from .frontend import bind_profiles, check_configurations, check_operators, load_model, profile_shapes
from .ort_headers import ort_headers
from .partition import Partition, boundary_value_info, part_loaded, partition, tensor_types
from .runtime_build import build_runtime, data_dir, staged_sources
from .spec import PASS_NAMES, Spec
from .targets import CpuTarget, CudaTarget, host_arch, resolve_all

Log = Callable[[str], None]
ORT_LIBRARY = "libpackager_ort.so"


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


def _check(spec: Spec, only_targets: list[str] | None):
    """Everything about the input that can be wrong, before anything is compiled."""
    model = load_model(spec.model)
    if not spec.onnxruntime.partial:
        check_operators(model)
        check_configurations(model)
    dtypes = bind_profiles(spec, model)
    targets = resolve_all(spec, only_targets)
    if any(isinstance(t, CudaTarget) for t in targets):
        check_cuda_toolchain(min(t.sm_number for t in targets if isinstance(t, CudaTarget)))
    return model, dtypes, targets


def _units(spec: Spec, model, dtypes) -> tuple[list[Unit], Partition | None, list]:
    """The whole model as one unit, or (partial offload) one unit per compiled part; with the
    partition and, per profile, every tensor's inferred dtype and shape."""
    profiles = [(p.name, profile_shapes(model, p)) for p in spec.profiles]
    if not spec.onnxruntime.partial:
        return [Unit("", "", model, profiles, dtypes)], None, []
    types = [tensor_types(model, shapes) for _, shapes in profiles]
    split = partition(model, types, spec.onnxruntime.keep_ops, spec.onnxruntime.keep_nodes)
    if split.whole:
        return [Unit("", "", model, profiles, dtypes)], None, types
    if not split.parts:
        raise UserError(f"{spec.model}: nothing left to compile: every node stays in ONNX Runtime "
                        f"({len(split.kept)} node(s)); check onnxruntime.keep_ops / keep_nodes")
    units = []
    for part in split.parts:
        sub = part_loaded(model, part, types)
        shapes = [(pname, {i: tuple(t[i][1]) for i in part.inputs}) for (pname, _), t in zip(profiles, types)]
        units.append(Unit(part.name, f"parts/{part.name}", sub, shapes, {i: types[0][i][0] for i in part.inputs}))
    return units, split, types


def _package_id(spec: Spec, model_sha: str, part: str = "") -> str:
    """Identifies one build of one part (the ORT op checks it opened the package it was built with)."""
    key = json.dumps([model_sha, spec.raw, __version__, part], sort_keys=True, default=str)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _add_runtimes(w: PackageWriter, runtimes: dict[str, Path]) -> tuple[dict, dict]:
    """Runtime binaries per architecture, the sources, and the ORT library per architecture."""
    w.copytree(staged_sources(), "runtime/src")
    runtime, ort_libs = {}, {}
    for arch, install in runtimes.items():
        dest = w.copytree(install, f"runtime/{arch}")
        runtime[arch] = {"cli": f"runtime/{arch}/bin/packrt-run", "library": f"runtime/{arch}/lib/libpackrt.so",
                         "static_library": f"runtime/{arch}/lib/libpackrt.a",
                         "example": f"runtime/{arch}/bin/packrt-example", "include": f"runtime/{arch}/include"}
        lib = dest / "lib" / ORT_LIBRARY
        if lib.is_file():
            w.path(f"ort/{arch}")
            shutil.move(lib, w.path(f"ort/{arch}/{ORT_LIBRARY}"))
            ort_libs[arch] = f"ort/{arch}/{ORT_LIBRARY}"
    return runtime, ort_libs


def _wrapper(model, units: list[Unit], split: Partition | None, ids: dict[str, str], types) -> onnx.ModelProto:
    nodes = list(model.proto.graph.node)
    if split is None:
        u = units[0]
        part = PackagedNode(model.path.stem, "..", ids[u.name], [i.name for i in model.inputs],
                            [o.name for o in model.outputs])
        return wrapper_model(model.proto, [part], [], [])
    parts = [PackagedNode(f"packaged_{p.name}", f"../parts/{p.name}", ids[u.name], p.inputs, p.outputs)
             for p, u in zip(split.parts, units)]
    produced = [o for p in split.parts for o in p.outputs]
    graph_outputs = {o.name for o in model.proto.graph.output}
    return wrapper_model(model.proto, parts, [nodes[k] for k in split.kept],
                         boundary_value_info([o for o in produced if o not in graph_outputs], types))


def _target_row(t: CpuTarget | CudaTarget, folder: str) -> str:
    what = f"{t.sm} (kernels.fatbin + kernels.cu)" if isinstance(t, CudaTarget) else f"{t.isa} / {t.mcpu}"
    return f"| {t.name} | {t.kind} | {t.arch} | {what} | `{folder}/{t.name}` |"


def _readme(spec: Spec, model, targets: list[CpuTarget | CudaTarget], ort_libs: dict, partial: bool) -> str:
    folder = "parts/*/targets" if partial else "targets"
    rows = "\n".join(_target_row(t, folder) for t in targets)
    io = ["| | name | dtype | shape (profile default) |", "|---|---|---|---|"]
    shapes = profile_shapes(model, spec.profiles[0])
    for i in model.inputs:
        io.append(f"| input | `{i.name}` | {i.dtype} | {list(shapes[i.name])} |")
    for o in model.outputs:
        io.append(f"| output | `{o.name}` | {o.dtype} | {list(o.shape)} |")
    example = " ".join(f"--input {i.name}={i.name}.npy" for i in model.inputs)
    feeds = ", ".join(f'"{i.name}": {i.name}_array' for i in model.inputs)
    arch = host_arch() if host_arch() in ort_libs else (next(iter(ort_libs), "x86_64"))
    note = ("This model is split: some nodes run in ONNX Runtime, the compiled parts (`parts/`) run through "
            "the custom op, so use it through ONNX Runtime (packrt-run and the C API run single parts, "
            "e.g. `parts/p0`)." if partial else
            "The whole model is compiled: ONNX Runtime only hands the tensors to the package.")
    tpl = string.Template((data_dir("templates") / "package_README.md").read_text())
    return tpl.substitute(name=spec.name, version=__version__, model_file=spec.model.name,
                          model_sha=sha256_file(spec.model)[:16], targets_table=rows,
                          io_table="\n".join(io), host_arch=targets[0].arch, example_inputs=example, feeds=feeds,
                          ort_arch=arch, ort_note=note)


def _unit_manifest(spec: Spec, unit: Unit, targets: list[CpuTarget | CudaTarget], package_id: str) -> dict:
    return {
        "name": f"{spec.name}.{unit.name}" if unit.name else spec.name,
        "id": package_id,
        "packager_version": __version__,
        "inputs": [{"name": i.name, "dtype": unit.dtypes[i.name], "shape": list(i.shape)} for i in unit.model.inputs],
        "outputs": [{"name": o.name, "dtype": o.dtype, "shape": list(o.shape)} for o in unit.model.outputs],
        "profiles": profiles_manifest(unit),
        "targets": targets_manifest(targets),
        "verify": {"rtol": spec.verify.rtol, "atol": spec.verify.atol},
    }


def build(spec: Spec, only_targets: list[str] | None = None, log: Log = print, bundle_runtime: bool = True) -> Path:
    """Build the package described by `spec`; returns the package folder. Without
    `bundle_runtime` the package holds only its compiled targets (for tools that bring the
    runtime themselves, like the conformance runner)."""
    t_start = time.perf_counter()
    st = Stages(log)
    log(f"pack build {spec.name}: {spec.model.name} -> {spec.output}")
    model, dtypes, targets = st.run("check spec and model", _check, spec, only_targets)
    units, split, types = st.run("partition for ONNX Runtime" if spec.onnxruntime.partial else "plan", _units,
                                 spec, model, dtypes)
    partial = split is not None
    if partial:
        kept = sorted({model.proto.graph.node[k].op_type for k in split.kept})
        log(f"  partial offload: {len(split.parts)} compiled part(s), {len(split.kept)} node(s) stay in "
            f"ONNX Runtime ({', '.join(kept)})")
    st.run(f"import + graph passes ({len(units)} unit(s), {len(spec.profiles)} profile(s))",
           lambda: [lower(u, spec.optimize, targets) for u in units])
    arches = sorted({t.arch for t in targets}, key=lambda a: a != host_arch())
    runtimes = {a: st.run(f"C++ runtime for {a}", build_runtime, a, log) for a in arches} if bundle_runtime else {}
    model_sha = sha256_file(spec.model)
    ids = {u.name: _package_id(spec, model_sha, u.name) for u in units}

    with PackageWriter(spec.output) as w:
        for u in units:
            compile_unit(u, targets, spec.optimize, w, log)
            if u.rel:
                w.write_manifest(_unit_manifest(spec, u, targets, ids[u.name]), under=u.rel)
        runtime, ort_libs = _add_runtimes(w, runtimes) if bundle_runtime else ({}, {})
        onnx.save(_wrapper(model, units, split, ids, types), str(w.path("ort/model.onnx")))
        w.write_text("README.md", _readme(spec, model, targets, ort_libs, partial))
        ort_note = "" if ort_libs or not bundle_runtime else f"custom-op library not built: {ort_headers()[1]}"
        report = {
            "package": spec.name, "packager_version": __version__, "model": str(spec.model),
            "optimize": {"level": spec.optimize.level, "passes": {p: spec.optimize.enabled(p) for p in PASS_NAMES}},
            "graph_passes": [p.as_dict() for p in units[0].graph_passes],
            "targets": [dict(r, part=u.name) if u.name else r for u in units for r in u.target_reports],
            "onnxruntime": _offload_report(model, split, units) | ({"note": ort_note} if ort_note else {}),
            "stages_seconds": st.times, "seconds": round(time.perf_counter() - t_start, 3)}
        w.write_json("build_report.json", report)
        manifest = {
            "name": spec.name, "id": _package_id(spec, model_sha),
            "packager_version": __version__,
            "source_model": {"path": str(spec.model), "sha256": model_sha, "bytes": spec.model.stat().st_size,
                             "opset": model.opset},
            "spec": spec.raw,
            "inputs": [{"name": i.name, "dtype": dtypes[i.name], "shape": list(i.shape)} for i in model.inputs],
            "outputs": [{"name": o.name, "dtype": o.dtype, "shape": list(o.shape)} for o in model.outputs],
            "profiles": [{"name": p.name, "inputs": {k: list(v) for k, v in profile_shapes(model, p).items()}}
                         for p in spec.profiles] if partial else profiles_manifest(units[0]),
            "ort": {"model": "ort/model.onnx", "library": ort_libs, "domain": "ai.packager", "op": "PackagedModel"},
            "runtime": runtime,
            "runtime_source": "runtime/src",
            "verify": {"rtol": spec.verify.rtol, "atol": spec.verify.atol},
            "build_report": "build_report.json",
        }
        if partial:
            manifest["parts"] = [{"name": u.name, "path": u.rel, "inputs": p.inputs, "outputs": p.outputs}
                                 for u, p in zip(units, split.parts)]
        else:
            manifest["targets"] = targets_manifest(targets)
        out = w.finish(manifest)
    for p in units[0].graph_passes:
        log(f"  pass {p.name}: {p.status}: {p.summary}")
    for tr in units[0].target_reports:
        for p in tr["kernel_passes"]:
            log(f"  pass {p['pass']} [{tr['name']}]: {p['status']}: {p['summary']}")
    if ort_note:
        log(f"  warning: ONNX Runtime {ort_note}")
    log(f"wrote {out} ({time.perf_counter() - t_start:.1f} s)")
    return out


def _offload_report(model, split: Partition | None, units: list[Unit]) -> dict:
    """What runs where: compiled parts and every node left to ONNX Runtime with the reason."""
    nodes = list(model.proto.graph.node)
    if split is None:
        return {"offloaded": "whole model", "kept_nodes": []}
    return {"offloaded": [{"part": u.name, "nodes": len(p.nodes), "op_types": sorted({nodes[k].op_type for k in p.nodes}),
                           "inputs": p.inputs, "outputs": p.outputs} for u, p in zip(units, split.parts)],
            "kept_nodes": [{"name": nodes[k].name, "op_type": nodes[k].op_type, "reason": split.reasons[k]}
                           for k in split.kept]}
