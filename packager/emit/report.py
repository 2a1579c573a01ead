"""build_report.json: what every pass did (per target for kernel passes), what runs where, timings."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import __version__
from ..frontend.control_flow import label
from ..frontend.partition import Partition
from ..spec import PASS_NAMES, Spec

if TYPE_CHECKING:
    from .assemble import CompiledUnit


def build_report(spec: Spec, model, units: list[CompiledUnit], split: Partition | None, stage_times: dict[str, float],
                 seconds: float, ort_note: str, reference: str = "", measured: dict | None = None) -> dict:
    return {
        "package": spec.name, "packager_version": __version__, "model": str(spec.model),
        "optimize": {"level": spec.optimize.level, "passes": {p: spec.optimize.enabled(p) for p in PASS_NAMES}},
        "frontend": {"opset": _opset(model), "control_flow": _control_flow(model), "folding": _folding(units)},
        "graph_passes": [p.as_dict() for p in units[0].graph_passes],
        "targets": [dict(r, part=u.name) if u.name else r for u in units for r in u.target_reports],
        "onnxruntime": offload_report(model, split, units) | ({"note": ort_note} if ort_note else {}),
        "reference": reference,
        "stages_seconds": stage_times, "seconds": round(seconds, 3),
        "measured": measured or {"programs": 0, "seconds": 0.0}}


def _opset(model) -> dict:
    """The model's opset, and what was done to bring it into the supported range."""
    conv = model.conversion
    if conv is None:
        return {"source": model.opset, "compiled": model.opset, "converted": False}
    return {"source": conv.source, "compiled": conv.target, "converted": True, "how": conv.how, "check": conv.check}


def _control_flow(model) -> dict:
    """If/Loop taken out because every profile makes them static, and why the others stay."""
    flow = model.control_flow
    return {"inlined": dict(flow.inlined), "kept": dict(flow.kept)} if flow else {"inlined": {}, "kept": {}}


def _folding(units: list[CompiledUnit]) -> dict:
    """Per compiled unit and profile: nodes onnxruntime folded to constants, nodes our rewrites
    changed (see frontend/fold.py and rewrites.py)."""
    return {f"{u.name or 'model'}/{p}": s.as_dict() for u in units for p, s in u.imports.items()}


def offload_report(model, split: Partition | None, units: list[CompiledUnit]) -> dict:
    """What runs where: compiled parts and every node left to ONNX Runtime with the reason."""
    nodes = list(model.proto.graph.node)
    if split is None:
        return {"offloaded": "whole model", "kept_nodes": []}
    return {"offloaded": [{"part": u.name, "nodes": len(p.nodes), "op_types": sorted({nodes[k].op_type for k in p.nodes}),
                           "inputs": p.inputs, "outputs": p.outputs} for u, p in zip(units, split.parts)],
            "kept_nodes": [{"name": nodes[k].name, "op_type": nodes[k].op_type, "reason": _reason(model, nodes[k],
                                                                                                    split.reasons[k])}
                           for k in split.kept]}


def _reason(model, node, reason: str) -> str:
    """An If/Loop the frontend could not take out says why (not just 'not supported')."""
    why = model.control_flow.kept.get(label(node)) if model.control_flow else None
    return f"{reason}: {why}" if why else reason
