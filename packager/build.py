"""`pack build`: spec -> package. The stages, in order, each reported with its time:

1. spec and model checks (nothing is compiled before every input problem is reported)
2. per shape profile: ONNX -> Relax -> graph passes -> legalized kernels + kernel graph
3. per target: kernel passes (schedules) -> LLVM object -> kernels.so, weights.bin, plan.json
4. the C++ runtime for each CPU architecture (cached), sources, README, manifest, report
"""
from __future__ import annotations

import re
import string
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import tvm
import tvm_ffi

from . import __version__
from .codegen import build_object, link_kernels, symbol_of
from .emit.package import PackageWriter, sha256_file
from .emit.plan import build_plan
from .emit.weights import WeightStore
from .errors import UserError
from .frontend import (bind_profiles, check_configurations, check_operators, import_relax, load_model,
                       profile_shapes)
from .lowering import Graph, extract_graph
from .optimize.pipeline import optimize_graph, optimize_kernels
from .runtime_build import build_runtime, data_dir, staged_sources
from .spec import PASS_NAMES, Spec
from .targets import CpuTarget, CudaTarget, host_arch, resolve_all

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


def _c_ident(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def merge_kernels(graphs: dict[str, Graph]) -> dict[str, tvm.tirx.PrimFunc]:
    """One kernel table for all profiles: identical kernels are shared, name clashes renamed."""
    table: dict[str, tvm.tirx.PrimFunc] = {}
    by_hash: dict[int, list[str]] = {}
    for pname, g in graphs.items():
        used = {c.kernel for c in g.calls}
        rename = {}
        for kname in sorted(used):
            f = g.kernels[kname]
            h = tvm_ffi.structural_hash(f)
            same = next((n for n in by_hash.get(h, []) if tvm_ffi.structural_equal(table[n], f)), None)
            if same is None:
                new = kname if kname not in table else f"{kname}_{_c_ident(pname)}"
                while new in table:
                    new += "_"
                table[new] = f
                by_hash.setdefault(h, []).append(new)
                same = new
            rename[kname] = same
        for c in g.calls:
            c.kernel = rename[c.kernel]
        g.kernels = {rename[k]: g.kernels[k] for k in used}
    return table


def _lower_profiles(spec: Spec, model, dtypes) -> tuple[dict[str, Graph], list]:
    graphs, reports = {}, []
    in_names = [i.name for i in model.inputs]
    out_names = [o.name for o in model.outputs]
    for prof in spec.profiles:
        mod = import_relax(model, profile_shapes(model, prof), dtypes)
        mod, passes = optimize_graph(mod, spec.optimize)
        graphs[prof.name] = extract_graph(mod, in_names, out_names)
        if not reports:
            reports = passes
    return graphs, reports


def _build_target(t: CpuTarget, spec: Spec, graphs, kernels, writer: PackageWriter, model, log: Log) -> dict:
    t0 = time.perf_counter()
    rel = f"targets/{t.name}"
    scheduled, passes = optimize_kernels(kernels, t, spec.optimize)
    obj = writer.path(f"{rel}/kernels.o")
    build_object(scheduled, t, obj)
    link_kernels(obj, t, writer.path(f"{rel}/kernels.so"))
    obj.unlink()
    weights = WeightStore()
    table = [(name, symbol_of(name), len(f.params)) for name, f in scheduled.items()]
    plan, stats = build_plan(t.name, graphs, table, weights, [i.name for i in model.inputs],
                             [o.name for o in model.outputs])
    weights.write(writer.path(f"{rel}/weights.bin"))
    writer.write_json(f"{rel}/plan.json", plan)
    log(f"  target {t.name}: {len(scheduled)} kernels, {weights.size / 1e6:.2f} MB weights, "
        f"arena {', '.join(f'{s.name} {s.arena_bytes / 1e6:.2f} MB' for s in stats)} "
        f"({time.perf_counter() - t0:.1f} s)")
    return {"name": t.name, **t.describe(), "kernel_passes": [p.as_dict() for p in passes],
            "kernels": len(scheduled), "weights_bytes": weights.size,
            "profiles": [asdict(s) for s in stats], "seconds": round(time.perf_counter() - t0, 3)}


def _readme(spec: Spec, model, targets: list[CpuTarget]) -> str:
    rows = "\n".join(f"| {t.name} | cpu | {t.arch} | {t.isa} / {t.mcpu} | `targets/{t.name}` |" for t in targets)
    io = ["| | name | dtype | shape (profile default) |", "|---|---|---|---|"]
    shapes = profile_shapes(model, spec.profiles[0])
    for i in model.inputs:
        io.append(f"| input | `{i.name}` | {i.dtype} | {list(shapes[i.name])} |")
    for o in model.outputs:
        io.append(f"| output | `{o.name}` | {o.dtype} | {list(o.shape)} |")
    example = " ".join(f"--input {i.name}={_c_ident(i.name)}.npy" for i in model.inputs)
    tpl = string.Template((data_dir("templates") / "package_README.md").read_text())
    return tpl.substitute(name=spec.name, version=__version__, model_file=spec.model.name,
                          model_sha=sha256_file(spec.model)[:16], targets_table=rows, io_table="\n".join(io),
                          host_arch=targets[0].arch, example_inputs=example)


def _check(spec: Spec, only_targets: list[str] | None):
    """Everything about the input that can be wrong, before anything is compiled."""
    model = load_model(spec.model)
    check_operators(model)
    check_configurations(model)
    dtypes = bind_profiles(spec, model)
    targets = resolve_all(spec, only_targets)
    gpu = [t for t in targets if isinstance(t, CudaTarget)]
    if gpu:
        raise UserError(f"target '{gpu[0].name}' ({gpu[0].sm}): CUDA code generation is not implemented in "
                        f"packager {__version__}; build CPU targets (x86-64, x86-avx2, x86-avx512, arm64) for now")
    return model, dtypes, [t for t in targets if isinstance(t, CpuTarget)]


def _add_runtimes(w: PackageWriter, runtimes: dict[str, Path]) -> dict:
    """Copy each architecture's runtime build and the runtime sources; return the manifest entry."""
    w.copytree(staged_sources(), "runtime/src")
    entry = {}
    for arch, install in runtimes.items():
        w.copytree(install, f"runtime/{arch}")
        entry[arch] = {"cli": f"runtime/{arch}/bin/packrt-run", "library": f"runtime/{arch}/lib/libpackrt.so",
                       "static_library": f"runtime/{arch}/lib/libpackrt.a",
                       "example": f"runtime/{arch}/bin/packrt-example", "include": f"runtime/{arch}/include"}
    return entry


def _manifest(spec: Spec, model, dtypes: dict, graphs: dict[str, Graph], targets: list[CpuTarget],
              runtime: dict) -> dict:
    profiles = []
    for p in spec.profiles:
        g = graphs[p.name]
        profiles.append({"name": p.name,
                         "inputs": {k: list(v) for k, v in profile_shapes(model, p).items()},
                         "outputs": {o.name: list(g.tensors[t].shape) for o, t in zip(model.outputs, g.outputs)}})
    return {
        "name": spec.name, "packager_version": __version__,
        "source_model": {"path": str(spec.model), "sha256": sha256_file(spec.model),
                         "bytes": spec.model.stat().st_size, "opset": model.opset},
        "spec": spec.raw,
        "inputs": [{"name": i.name, "dtype": dtypes[i.name], "shape": list(i.shape)} for i in model.inputs],
        "outputs": [{"name": o.name, "dtype": o.dtype, "shape": list(o.shape)} for o in model.outputs],
        "profiles": profiles,
        "targets": [{"name": t.name, **t.describe(), "path": f"targets/{t.name}",
                     "plan": f"targets/{t.name}/plan.json", "kernels": f"targets/{t.name}/kernels.so",
                     "weights": f"targets/{t.name}/weights.bin"} for t in targets],
        "runtime": runtime,
        "runtime_source": "runtime/src",
        "verify": {"rtol": spec.verify.rtol, "atol": spec.verify.atol},
        "build_report": "build_report.json",
    }


def build(spec: Spec, only_targets: list[str] | None = None, log: Log = print) -> Path:
    """Build the package described by `spec`; returns the package folder."""
    t_start = time.perf_counter()
    st = Stages(log)
    log(f"pack build {spec.name}: {spec.model.name} -> {spec.output}")
    model, dtypes, targets = st.run("check spec and model", _check, spec, only_targets)
    graphs, graph_passes = st.run(f"import + graph passes ({len(spec.profiles)} profile(s))",
                                  _lower_profiles, spec, model, dtypes)
    kernels = merge_kernels(graphs)
    arches = sorted({t.arch for t in targets}, key=lambda a: a != host_arch())
    runtimes = {a: st.run(f"C++ runtime for {a}", build_runtime, a, log) for a in arches}

    with PackageWriter(spec.output) as w:
        target_reports = [_build_target(t, spec, graphs, kernels, w, model, log) for t in targets]
        runtime = _add_runtimes(w, runtimes)
        w.write_text("README.md", _readme(spec, model, targets))
        w.write_json("build_report.json", {
            "package": spec.name, "packager_version": __version__, "model": str(spec.model),
            "optimize": {"level": spec.optimize.level, "passes": {p: spec.optimize.enabled(p) for p in PASS_NAMES}},
            "graph_passes": [p.as_dict() for p in graph_passes], "targets": target_reports,
            "stages_seconds": st.times, "seconds": round(time.perf_counter() - t_start, 3)})
        out = w.finish(_manifest(spec, model, dtypes, graphs, targets, runtime))
    for p in graph_passes:
        log(f"  pass {p.name}: {p.status}: {p.summary}")
    for tr in target_reports:
        for p in tr["kernel_passes"]:
            log(f"  pass {p['pass']} [{tr['name']}]: {p['status']}: {p['summary']}")
    log(f"wrote {out} ({time.perf_counter() - t_start:.1f} s)")
    return out
