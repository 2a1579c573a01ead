"""The per-unit stages between the frontend and the package writer:

optimize_unit: per shape profile, ONNX -> Relax -> graph passes -> kernel graph (once per
pipeline key: targets whose graph passes give the same result share it);
compile_unit: per target, kernel passes -> the backend's kernel artifact, weights.bin, plan.json.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Callable

import tvm

from ..emit.package import PackageWriter
from ..emit.plan import build_plan
from ..emit.weights import WeightStore
from ..frontend import import_relax
from ..frontend.units import PER_TARGET_REPORTS, Unit
from ..optimize.layout.search import ProfileMemo
from ..optimize.pipeline import graph_passes, optimize_graph, optimize_kernels, pipeline_key
from ..spec import OptimizeSpec
from ..targets import Target
from .backend import backend_for
from .graph import extract_graph, merge_kernels
from ..optimize.kernel_cost import kernel_cost

Log = Callable[[str], None]


def graph_key(target: Target, opt: OptimizeSpec) -> str:
    return pipeline_key(target, graph_passes(target), opt)


def optimize_unit(unit: Unit, opt: OptimizeSpec, targets: list[Target]) -> None:
    """Import every profile of the unit and run the graph passes, once per pipeline key; fills
    unit.graphs_by_key and unit.reports_by_key."""
    in_names = [i.name for i in unit.model.inputs]
    out_names = [o.name for o in unit.model.outputs]
    imported: dict[str, tvm.IRModule] = {}            # one ONNX import per profile, shared by the keys
    for t in targets:
        key = graph_key(t, opt)
        if key in unit.graphs_by_key:
            continue
        graphs, reports, memo = {}, None, ProfileMemo()
        for pname, shapes in unit.profiles:
            if pname not in imported:
                imported[pname], unit.imports[pname] = import_relax(unit.model, shapes, unit.dtypes)
            mod, passes = optimize_graph(imported[pname], opt, t, memo)
            graphs[pname] = extract_graph(mod, in_names, out_names)
            reports = reports or passes
        unit.graphs_by_key[key], unit.reports_by_key[key] = graphs, reports


def compile_target(unit: Unit, t: Target, kernels: dict, opt: OptimizeSpec, w: PackageWriter, log: Log) -> dict:
    """One target's kernels, weights and plan; returns its build-report row."""
    t0 = time.perf_counter()
    backend = backend_for(t)
    folder = unit.path(f"targets/{t.name}")
    key = graph_key(t, opt)
    scheduled, passes = optimize_kernels(kernels, t, opt, log)
    passes = [p for p in unit.reports_by_key[key] if p.name in PER_TARGET_REPORTS] + passes
    compiled = backend.compile(scheduled, t, folder, w)
    weights = WeightStore()
    plan, stats = build_plan(t.name, unit.graphs_by_key[key], compiled.table, weights,
                             [i.name for i in unit.model.inputs], [o.name for o in unit.model.outputs],
                             device=t.kind, kernel_fields=compiled.kernel_fields, plan_fields=backend.plan_fields())
    for entry in plan["kernels"]:                   # work and traffic, for roofline reports
        cost = kernel_cost(kernels[entry["name"]])
        entry["flops"], entry["bytes"] = cost.flops, cost.bytes
    weights.write(w.path(f"{folder}/weights.bin"))
    w.write_json(f"{folder}/plan.json", plan)
    where = f" [part {unit.name}]" if unit.name else ""
    log(f"  target {t.name}{where}: {len(scheduled)} kernels{compiled.log_note}, {weights.size / 1e6:.2f} MB weights, "
        f"arena {', '.join(f'{s.name} {s.arena_bytes / 1e6:.2f} MB' for s in stats)} "
        f"({time.perf_counter() - t0:.1f} s)")
    return {"name": t.name, **t.describe(), "kernel_passes": [p.as_dict() for p in passes],
            "kernels": len(scheduled), "weights_bytes": weights.size, **compiled.report,
            "profiles": [asdict(s) for s in stats], "seconds": round(time.perf_counter() - t0, 3)}


def compile_unit(unit: Unit, targets: list[Target], opt: OptimizeSpec, w: PackageWriter, log: Log) -> None:
    """Every target's plan, kernels and weights for a unit whose graph passes ran."""
    kernels = {key: merge_kernels(graphs) for key, graphs in unit.graphs_by_key.items()}
    unit.target_reports = [compile_target(unit, t, kernels[graph_key(t, opt)], opt, w, log) for t in targets]
