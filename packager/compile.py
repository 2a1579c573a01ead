"""Compile one model (the whole model, or one part of a partial offload) into target folders:

per shape profile: ONNX -> Relax -> graph passes -> legalized kernels + kernel graph;
per target: kernel passes (schedules) -> LLVM object -> kernels.so (CPU) or CUDA C -> kernels.fatbin
(GPU), weights.bin, plan.json.
"""
from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import tvm
import tvm_ffi

from .codegen import build_object, link_kernels, symbol_of
from .cuda_codegen import compile_fatbin, lower_cuda
from .emit.package import PackageWriter
from .emit.plan import build_plan
from .emit.weights import WeightStore
from .frontend import LoadedModel, import_relax
from .kernel_cost import kernel_cost
from .lowering import Graph, extract_graph
from .optimize.base import PassReport
from .optimize.layout.search import ProfileMemo
from .optimize.pipeline import layout_key, optimize_graph, optimize_kernels
from .spec import OptimizeSpec
from .targets import CpuTarget, CudaTarget

Log = Callable[[str], None]


@dataclass
class Unit:
    """A model to compile and where its files go inside the package."""

    name: str                                     # "" for the whole model, "p0", ... for parts
    rel: str                                      # folder inside the package ("" or "parts/p0")
    model: LoadedModel
    profiles: list[tuple[str, dict[str, tuple[int, ...]]]]   # (profile name, input shapes)
    dtypes: dict[str, str]
    # per layout key (pipeline.layout_key: one per CPU target when the layout pass runs, else
    # "nchw"): profile name -> kernel graph, and the graph passes' reports
    lowerings: dict[str, dict[str, Graph]] = field(default_factory=dict)
    lowering_passes: dict[str, list[PassReport]] = field(default_factory=dict)
    target_reports: list[dict] = field(default_factory=list)

    @property
    def graphs(self) -> dict[str, Graph]:
        """Any lowering's graphs (all share the ONNX inputs and outputs)."""
        return next(iter(self.lowerings.values()))

    @property
    def graph_passes(self) -> list[PassReport]:
        """Target-independent graph passes (the layout pass is reported per target)."""
        return [p for p in next(iter(self.lowering_passes.values())) if p.name != "layout"]

    def path(self, rel: str) -> str:
        return f"{self.rel}/{rel}" if self.rel else rel


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


def lower(unit: Unit, opt: OptimizeSpec, targets: list[CpuTarget | CudaTarget]) -> None:
    """Import every profile of the unit and run the graph passes, once per layout key (CPU targets
    choose their own layouts); fills unit.lowerings."""
    in_names = [i.name for i in unit.model.inputs]
    out_names = [o.name for o in unit.model.outputs]
    imported: dict[str, tvm.IRModule] = {}            # one ONNX import per profile, shared by the keys
    for t in targets:
        key = layout_key(t, opt)
        if key in unit.lowerings:
            continue
        graphs, reports, memo = {}, None, ProfileMemo()
        for pname, shapes in unit.profiles:
            if pname not in imported:
                imported[pname] = import_relax(unit.model, shapes, unit.dtypes)
            mod, passes = optimize_graph(imported[pname], opt, t, memo)
            graphs[pname] = extract_graph(mod, in_names, out_names)
            reports = reports or passes
        unit.lowerings[key], unit.lowering_passes[key] = graphs, reports


def _cpu_kernels(scheduled: dict, t: CpuTarget, rel: str, w: PackageWriter) -> tuple[list, dict, dict]:
    obj = w.path(f"{rel}/kernels.o")
    build_object(scheduled, t, obj)
    link_kernels(obj, t, w.path(f"{rel}/kernels.so"))
    obj.unlink()
    return [(name, symbol_of(name), len(f.params)) for name, f in scheduled.items()], {}, {}


def _cuda_kernels(scheduled: dict, t: CudaTarget, rel: str, w: PackageWriter) -> tuple[list, dict, dict]:
    cm = lower_cuda(scheduled, t)
    w.write_text(f"{rel}/kernels.cu", cm.source)
    compiler = compile_fatbin(cm.source, t.sm, w.path(f"{rel}/kernels.fatbin"))
    extra = {name: {"launches": [ln.as_dict() for ln in k.launches], "workspace": k.workspace}
             for name, k in cm.kernels.items()}
    table = [(name, cm.kernels[name].launches[0].function, len(f.params)) for name, f in scheduled.items()]
    info = {"compiler": compiler, "device_functions": sum(len(k.launches) for k in cm.kernels.values()),
            "source_bytes": len(cm.source)}
    return table, extra, info


def build_target(unit: Unit, t: CpuTarget | CudaTarget, kernels: dict, opt: OptimizeSpec, w: PackageWriter,
                 log: Log) -> dict:
    t0 = time.perf_counter()
    rel = unit.path(f"targets/{t.name}")
    key = layout_key(t, opt)
    graphs = unit.lowerings[key]
    scheduled, passes = optimize_kernels(kernels, t, opt)
    passes = [p for p in unit.lowering_passes[key] if p.name == "layout"] + passes
    make = _cuda_kernels if isinstance(t, CudaTarget) else _cpu_kernels
    table, extra, info = make(scheduled, t, rel, w)
    weights = WeightStore()
    plan, stats = build_plan(t.name, graphs, table, weights, [i.name for i in unit.model.inputs],
                             [o.name for o in unit.model.outputs], device=t.kind, kernel_extra=extra)
    for entry in plan["kernels"]:                   # work and traffic, for roofline reports
        cost = kernel_cost(kernels[entry["name"]])
        entry["flops"], entry["bytes"] = cost.flops, cost.bytes
    weights.write(w.path(f"{rel}/weights.bin"))
    w.write_json(f"{rel}/plan.json", plan)
    where = f" [part {unit.name}]" if unit.name else ""
    how = f", {info['compiler']} for {t.sm}" if info else ""
    log(f"  target {t.name}{where}: {len(scheduled)} kernels{how}, {weights.size / 1e6:.2f} MB weights, "
        f"arena {', '.join(f'{s.name} {s.arena_bytes / 1e6:.2f} MB' for s in stats)} "
        f"({time.perf_counter() - t0:.1f} s)")
    return {"name": t.name, **t.describe(), "kernel_passes": [p.as_dict() for p in passes],
            "kernels": len(scheduled), "weights_bytes": weights.size, **({"cuda": info} if info else {}),
            "profiles": [asdict(s) for s in stats], "seconds": round(time.perf_counter() - t0, 3)}


def compile_unit(unit: Unit, targets: list[CpuTarget | CudaTarget], opt: OptimizeSpec, w: PackageWriter, log: Log) -> None:
    """Every target's plan, kernels and weights for an already lowered unit."""
    kernels = {key: merge_kernels(graphs) for key, graphs in unit.lowerings.items()}
    unit.target_reports = [build_target(unit, t, kernels[layout_key(t, opt)], opt, w, log) for t in targets]


def targets_manifest(targets: list[CpuTarget | CudaTarget]) -> list[dict]:
    """The manifest's target entries (paths relative to the unit's own folder)."""
    out = []
    for t in targets:
        d = f"targets/{t.name}"
        entry = {"name": t.name, **t.describe(), "path": d, "plan": f"{d}/plan.json", "weights": f"{d}/weights.bin"}
        if isinstance(t, CudaTarget):
            entry |= {"kernels": f"{d}/kernels.fatbin", "source": f"{d}/kernels.cu"}
        else:
            entry["kernels"] = f"{d}/kernels.so"
        out.append(entry)
    return out


def profiles_manifest(unit: Unit) -> list[dict]:
    out = []
    for pname, shapes in unit.profiles:
        g = unit.graphs[pname]
        out.append({"name": pname, "inputs": {k: list(v) for k, v in shapes.items()},
                    "outputs": {o.name: list(g.tensors[t].shape) for o, t in zip(unit.model.outputs, g.outputs)}})
    return out
