"""The package around the compiled units: per unit its reference data and (for a part) its own
manifest, then the runtimes, README, build report, root manifest and the ONNX Runtime wrapper
model, which pins each manifest it opens by sha256. The build hands over what its stages made;
everything written here is bookkeeping derived from it."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from .. import __version__
from .manifest import WRAPPER_MODEL, package_manifest, source_sha256, unit_manifest
from .ort_headers import ort_headers
from .ort_wrapper import wrapper_for
from .package import PackageWriter
from .readme import package_readme
from .reference import REFERENCE_FILE, References, write_reference
from .report import build_report
from .runtime import bundle_runtimes

if TYPE_CHECKING:
    from ..codegen.graph import Graph
    from ..frontend.model import LoadedModel
    from ..frontend.partition import Partition
    from ..frontend.relax_import import ImportStats
    from ..frontend.units import Unit
    from ..optimize.base import PassReport
    from ..spec import Spec
    from ..targets import Target


@dataclass(frozen=True)
class CompiledUnit:
    """A unit compiled for every target: what the emitters read (its kernel graphs per profile,
    the target-independent graph passes, what the frontend did, one report row per target)."""

    unit: Unit
    graphs: dict[str, Graph]
    graph_passes: list[PassReport]
    imports: dict[str, ImportStats]
    target_reports: list[dict]

    name = property(lambda self: self.unit.name)
    rel = property(lambda self: self.unit.rel)
    model = property(lambda self: self.unit.model)
    profiles = property(lambda self: self.unit.profiles)
    dtypes = property(lambda self: self.unit.dtypes)


@dataclass(frozen=True)
class Build:
    """What the build's stages made, for the package's bookkeeping."""

    spec: Spec
    model: LoadedModel
    dtypes: dict[str, str]
    targets: list[Target]
    split: Partition | None
    types: list                                   # per profile, every tensor's (dtype, shape)
    references: References


def write_units(w: PackageWriter, b: Build, units: list[CompiledUnit]) -> dict[str, str]:
    """Each unit's reference data and, for a part of a partially offloaded model, its manifest;
    returns unit name -> sha256 of the manifest its PackagedModel node opens (parts only)."""
    stored = {r.rel: r for r in b.references.units}
    model_sha = source_sha256(b.spec.model)
    pins: dict[str, str] = {}
    for u in units:
        if u.rel in stored:
            write_reference(w, stored[u.rel], b.spec.verify, _precisions(b))
        if u.rel:
            manifest = unit_manifest(b.spec, u, b.targets, package_id(b.spec, model_sha, u.name))
            pins[u.name] = w.write_manifest(manifest | _reference_entry(u.rel, stored), under=u.rel)
    if b.split is not None and "" in stored:
        write_reference(w, stored[""], b.spec.verify, _precisions(b))
    return pins


def _precisions(b: Build) -> dict[str, str]:
    """Target name -> the precision it was built in."""
    return {t.name: b.spec.optimize.precision_of(t.name) for t in b.targets}


def write_package(w: PackageWriter, b: Build, units: list[CompiledUnit], pins: dict[str, str],
                  runtimes: dict[str, Path], report: dict) -> str:
    """Runtimes, README, build_report.json (`report`: the build's stage times and tally, added to
    what the units say), the root manifest and the wrapper model; returns the note on the ORT
    custom-op library ("" when it was built or the package bundles no runtime)."""
    spec, model = b.spec, b.model
    stored = {r.rel: r for r in b.references.units}
    runtime, ort_libs = bundle_runtimes(w, runtimes) if runtimes is not None else ({}, {})
    w.write_text("README.md", package_readme(spec, model, b.targets, ort_libs, b.split is not None))
    ort_note = "" if ort_libs or runtimes is None else f"custom-op library not built: {ort_headers()[1]}"
    w.write_json("build_report.json", build_report(spec, model, units, b.split, ort_note=ort_note,
                                                   reference=b.references.summary(), **report))
    model_sha = source_sha256(spec.model)
    root_sha = w.write_manifest(package_manifest(spec, model, b.dtypes, units, b.split, b.targets,
                                                 package_id(spec, model_sha), model_sha, runtime, ort_libs)
                                | _reference_entry("", stored))
    pins = pins | {u.name: root_sha for u in units if not u.rel}
    ids = {u.name: package_id(spec, model_sha, u.name) for u in units}
    # Written after the manifest, which it pins (so the manifest does not list it).
    onnx.save(wrapper_for(model, units, b.split, ids, pins, b.types), str(w.path(WRAPPER_MODEL)))
    return ort_note


def package_id(spec: Spec, model_sha: str, part: str = "") -> str:
    """Identifies one build of one part (the ORT op checks it opened the package it was built with)."""
    key = json.dumps([model_sha, spec.raw, __version__, part], sort_keys=True, default=str)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _reference_entry(rel: str, stored: dict) -> dict:
    """The manifest's `reference` field of the (sub-)package at `rel`, when it has reference data."""
    return {"reference": REFERENCE_FILE} if rel in stored else {}
