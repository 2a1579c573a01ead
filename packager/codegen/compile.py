"""The per-unit stages between the frontend and the package writer:

optimize_unit: per shape profile, ONNX -> Relax -> graph passes -> kernel graph (once per
pipeline key: targets whose graph passes give the same result share it) -> OptimizedUnit;
compile_unit: per target, kernel passes -> the backend's kernel artifact, weights.bin, plan.json
-> CompiledUnit (what the emitters read).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import tvm

from ..emit.assemble import CompiledUnit
from ..emit.package import PackageWriter
from ..emit.in_place import find_assemblies
from ..emit.plan import build_plan
from ..emit.weights import WeightStore
from ..frontend import import_relax
from ..frontend.relax_import import ImportStats
from ..frontend.units import Unit
from ..optimize.base import PassReport
from ..optimize.layout.memo import ProfileMemo
from ..optimize.pipeline import PIPELINES, graph_passes, optimize_graph, optimize_kernels, pipeline_key
from ..optimize.schedule.contract import Tally
from ..spec import OptimizeSpec
from ..targets import Target
from .backend import backend_for
from .graph import Graph, extract_graph, merge_kernels
from ..optimize.kernel_cost import kernel_cost

Log = Callable[[str], None]
# Graph passes whose result depends on the target: reported with each target's kernel passes.
PER_TARGET_REPORTS = {p.name for graph, _ in PIPELINES.values() for p in graph if p.per_target}


@dataclass
class OptimizedUnit:
    """A unit after import and graph passes: per pipeline key (targets whose graph passes give the
    same result share one), profile name -> kernel graph and the graph passes' reports; and what
    the frontend did per profile."""

    unit: Unit
    graphs_by_key: dict[str, dict[str, Graph]]
    reports_by_key: dict[str, list[PassReport]]
    imports: dict[str, ImportStats]

    @property
    def graphs(self) -> dict[str, Graph]:
        """Any key's graphs (all share the ONNX inputs and outputs)."""
        return next(iter(self.graphs_by_key.values()))

    @property
    def graph_passes(self) -> list[PassReport]:
        """Target-independent graph passes (the per-target ones are reported per target)."""
        return [p for p in next(iter(self.reports_by_key.values())) if p.name not in PER_TARGET_REPORTS]


def graph_key(target: Target, opt: OptimizeSpec) -> str:
    return pipeline_key(target, graph_passes(target), opt)


def optimize_unit(unit: Unit, opt: OptimizeSpec, targets: list[Target], tally: Tally) -> OptimizedUnit:
    """Import every profile of the unit and run the graph passes, once per pipeline key (timing
    counted into `tally`)."""
    in_names = [i.name for i in unit.model.inputs]
    out_names = [o.name for o in unit.model.outputs]
    imported: dict[str, tvm.IRModule] = {}            # one ONNX import per profile, shared by the keys
    out = OptimizedUnit(unit, {}, {}, {})
    for t in targets:
        key = graph_key(t, opt)
        if key in out.graphs_by_key:
            continue
        graphs, reports, memo = {}, None, ProfileMemo()
        for pname, shapes in unit.profiles:
            if pname not in imported:
                imported[pname], out.imports[pname] = import_relax(unit.model, shapes, unit.dtypes,
                                                                   simplify=opt.enabled("simplify"))
            mod, passes = optimize_graph(imported[pname], opt, t, memo, tally)
            graphs[pname] = extract_graph(mod, in_names, out_names)
            reports = reports or passes
        out.graphs_by_key[key], out.reports_by_key[key] = graphs, reports
    return out


def compile_target(unit: OptimizedUnit, t: Target, kernels: dict, opt: OptimizeSpec, w: PackageWriter, log: Log,
                   tally: Tally) -> dict:
    """One target's kernels, weights and plan; returns its build-report row."""
    t0 = time.perf_counter()
    backend = backend_for(t)
    folder = unit.unit.path(f"targets/{t.name}")
    key = graph_key(t, opt)
    scheduled, passes = optimize_kernels(kernels, t, opt, log, tally)
    passes = [p for p in unit.reports_by_key[key] if p.name in PER_TARGET_REPORTS] + passes
    compiled = backend.compile(scheduled, t, folder, w)
    weights = WeightStore()
    plan, stats = build_plan(t.name, unit.graphs_by_key[key], compiled.table, weights,
                             [i.name for i in unit.unit.model.inputs], [o.name for o in unit.unit.model.outputs],
                             device=t.kind, kernel_fields=compiled.kernel_fields, plan_fields=backend.plan_fields())
    for entry in plan["kernels"]:                   # work and traffic, for roofline reports
        cost = kernel_cost(kernels[entry["name"]])
        entry["flops"], entry["bytes"] = cost.flops, cost.bytes
    passes.append(_in_place_report(stats, opt))
    weights.write(w.path(f"{folder}/weights.bin"))
    w.write_json(f"{folder}/plan.json", plan)
    where = f" [part {unit.unit.name}]" if unit.unit.name else ""
    log(f"  target {t.name}{where}: {len(scheduled)} kernels{compiled.log_note}, {weights.size / 1e6:.2f} MB weights, "
        f"arena {', '.join(f'{s.name} {s.arena_bytes / 1e6:.2f} MB' for s in stats)} "
        f"({time.perf_counter() - t0:.1f} s)")
    return {"name": t.name, **t.describe(), "kernel_passes": [p.as_dict() for p in passes],
            "kernels": len(scheduled), "weights_bytes": weights.size, **compiled.report,
            "profiles": [asdict(s) for s in stats], "seconds": round(time.perf_counter() - t0, 3)}


def compile_unit(unit: OptimizedUnit, targets: list[Target], opt: OptimizeSpec, w: PackageWriter, log: Log,
                 tally: Tally) -> CompiledUnit:
    """Every target's plan, kernels and weights for a unit whose graph passes ran."""
    for graphs in unit.graphs_by_key.values():
        for g in graphs.values():
            g.assemblies = find_assemblies(g) if opt.enabled("concat_in_place") else []
    kernels = {key: merge_kernels(graphs) for key, graphs in unit.graphs_by_key.items()}
    reports = [compile_target(unit, t, kernels[graph_key(t, opt)], opt, w, log, tally) for t in targets]
    return CompiledUnit(unit.unit, unit.graphs, unit.graph_passes, unit.imports, reports)


def _in_place_report(stats: list, opt: OptimizeSpec) -> PassReport:
    """The build report's line for concats assembled in place (emit/in_place.py)."""
    if not opt.enabled("concat_in_place"):
        return PassReport("concat_in_place", "disabled", "off in the spec: every concat runs as a copy kernel")
    per = ", ".join(f"{s.name} {s.assembled} ({s.assembled_bytes / 1e6:.2f} MB not copied per run)" for s in stats)
    return PassReport("concat_in_place", "applied",
                      f"concats whose producers write their slices of the output in place: {per}",
                      {s.name: {"assembled": s.assembled, "bytes": s.assembled_bytes} for s in stats})
