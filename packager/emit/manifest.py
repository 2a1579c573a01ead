"""manifest.json: the one module that owns its schema, writer and reader side by side.

Schema (format "packager-package", version 1), at the package root:
  name, id (build identity, checked by the ORT op), packager_version,
  source_model {path, sha256, bytes, opset}, spec (as written),
  inputs / outputs [{name, dtype, shape}], profiles [{name, inputs {name: shape}, outputs {name: shape}}],
  targets [{name, kind, arch, ..., path, plan, weights, kernels (+ source for CUDA)}]   (whole models)
  parts [{name, path, inputs, outputs}]                    (split models: each part is a sub-package
                                                            with its own manifest.json of the same form)
  ort {model, library {arch: path}, domain, op}, runtime {arch: {cli, library, static_library, example,
  include}}, runtime_source, verify {rtol, atol, inputs (fixed test values)}, build_report,
  reference (reference/reference.json: seeded inputs and onnxruntime's outputs, see reference.py;
             absent when not stored; parts have their own),
  files {relative path: {bytes, sha256}}   (every file below the manifest's folder but itself and the
                                            wrapper model ort/model.onnx, written after it: each of the
                                            wrapper's PackagedModel nodes pins the sha256 of the
                                            manifest.json it opens instead)
Paths are relative to the manifest's folder. The C++ runtime reads the same fields
(runtime_cpp/src/package.cpp).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..errors import UserError

if TYPE_CHECKING:
    from .assemble import CompiledUnit
    from ..spec import Spec
    from ..targets import Target

MANIFEST_FORMAT, MANIFEST_VERSION = "packager-package", 1
WRAPPER_MODEL = "ort/model.onnx"   # the ONNX Runtime wrapper model, relative to the package root
BENCH_RESULTS = "bench.json"       # `pack bench`'s last results, written into a package after its build


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def source_sha256(path: Path) -> str:
    """sha256 of the model a package is built from, hashed once per file version: the manifests
    and the README all name it (three reads of GPT-2's 500 MB, 1.2 s, every build)."""
    st = os.stat(path)
    return _source_sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=16)
def _source_sha256(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(Path(path))


# ---- writer -------------------------------------------------------------------------------------

def target_entries(targets: list[Target], spec: Spec) -> list[dict]:
    """The manifest's target entries (paths relative to the unit's own folder); a target built in
    reduced precision names it and the tolerance its outputs are checked with."""
    from ..codegen.backend import backend_for

    out = []
    for t in targets:
        d = f"targets/{t.name}"
        precision = spec.optimize.precision_of(t.name)
        tol = {} if precision == "fp32" else dict(zip(("rtol", "atol"), spec.verify.tolerance(precision)))
        out.append({"name": t.name, **t.describe(), "path": d, "plan": f"{d}/plan.json", "weights": f"{d}/weights.bin",
                    **backend_for(t).manifest_files(d), "precision": precision, **({"verify": tol} if tol else {})})
    return out


def profile_entries(unit: CompiledUnit) -> list[dict]:
    out = []
    for pname, shapes in unit.profiles:
        g = unit.graphs[pname]
        out.append({"name": pname, "inputs": {k: list(v) for k, v in shapes.items()},
                    "outputs": {o.name: list(g.tensors[t].shape) for o, t in zip(unit.model.outputs, g.outputs)}})
    return out


def io_entries(model, dtypes: dict[str, str]) -> dict[str, list[dict]]:
    return {"inputs": [{"name": i.name, "dtype": dtypes[i.name], "shape": list(i.shape)} for i in model.inputs],
            "outputs": [{"name": o.name, "dtype": o.dtype, "shape": list(o.shape)} for o in model.outputs]}


def unit_manifest(spec: Spec, unit: CompiledUnit, targets: list[Target], package_id: str) -> dict:
    """A compiled part's manifest (a sub-package the runtime opens on its own)."""
    return {"name": f"{spec.name}.{unit.name}" if unit.name else spec.name, "id": package_id,
            "packager_version": __version__, **io_entries(unit.model, unit.dtypes),
            "profiles": profile_entries(unit), "targets": target_entries(targets, spec),
            "verify": {"rtol": spec.verify.rtol, "atol": spec.verify.atol}}


def package_manifest(spec: Spec, model, dtypes: dict[str, str], units: list[CompiledUnit], split, targets: list[Target],
                     package_id: str, model_sha: str, runtime: dict, ort_libs: dict) -> dict:
    """The root manifest (the writer adds format, version and files)."""
    from ..frontend import profile_shapes

    manifest = {
        "name": spec.name, "id": package_id, "packager_version": __version__,
        "source_model": {"path": str(spec.model), "sha256": model_sha, "bytes": spec.model.stat().st_size,
                         "opset": model.conversion.source if model.conversion else model.opset},
        "spec": spec.raw, **io_entries(model, dtypes),
        "profiles": [{"name": p.name, "inputs": {k: list(v) for k, v in profile_shapes(model, p).items()}}
                     for p in spec.profiles] if split is not None else profile_entries(units[0]),
        "ort": {"model": WRAPPER_MODEL, "library": ort_libs, "domain": "ai.packager", "op": "PackagedModel"},
        "runtime": runtime, "runtime_source": "runtime/src",
        "verify": {"rtol": spec.verify.rtol, "atol": spec.verify.atol, "inputs": spec.verify.inputs},
        "build_report": "build_report.json",
    }
    if split is not None:
        manifest["parts"] = [{"name": u.name, "path": u.rel, "inputs": p.inputs, "outputs": p.outputs}
                             for u, p in zip(units, split.parts)]
    else:
        manifest["targets"] = target_entries(targets, spec)
    return manifest


# ---- reader -------------------------------------------------------------------------------------

@dataclass
class PackageInfo:
    root: Path
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def targets(self) -> list[dict[str, Any]]:
        return self.manifest["targets"]

    def target(self, name: str) -> dict[str, Any]:
        for t in self.targets:
            if t["name"] == name:
                return t
        raise UserError(f"{self.root}: no target '{name}' (targets: {', '.join(t['name'] for t in self.targets)})")

    def cli(self, arch: str) -> Path:
        entry = self.manifest.get("runtime", {}).get(arch)
        if not entry:
            raise UserError(f"{self.root}: the package has no runtime for {arch}")
        return self.root / entry["cli"]

    def check_files(self) -> list[str]:
        """Problems with the package's files (missing, wrong size, wrong sha256); empty if intact."""
        problems = []
        for rel, f in self.manifest.get("files", {}).items():
            p = self.root / rel
            if not p.is_file():
                problems.append(f"{rel}: missing")
            elif p.stat().st_size != f["bytes"]:
                problems.append(f"{rel}: {p.stat().st_size} bytes, manifest says {f['bytes']}")
            elif sha256_file(p) != f["sha256"]:
                problems.append(f"{rel}: sha256 mismatch")
        return problems + self._check_pins()

    def _check_pins(self) -> list[str]:
        """The wrapper model is not listed (it is written after the manifest): each of its
        PackagedModel nodes must pin the sha256 of the manifest.json it opens."""
        import onnx

        wrapper = self.root / WRAPPER_MODEL
        if not wrapper.is_file():
            return [f"{WRAPPER_MODEL}: missing"] if "ort" in self.manifest else []
        problems = []
        for node in onnx.load(str(wrapper), load_external_data=False).graph.node:
            if node.domain != "ai.packager":
                continue
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            pin = attrs.get("package_sha256", b"").decode()
            target = (wrapper.parent / attrs.get("package", b"").decode() / "manifest.json").resolve()
            if not target.is_file():
                problems.append(f"{WRAPPER_MODEL}: node {node.name} opens {target.parent}, which has no manifest.json")
            elif sha256_file(target) != pin:
                problems.append(f"{WRAPPER_MODEL}: node {node.name} pins manifest sha256 {pin or '(none)'}, "
                                f"{target.relative_to(self.root)} has {sha256_file(target)}")
        return problems


def output_file(name: str) -> str:
    """The .npy file name packrt-run writes for output `name` (same rule as tools/packrt_run.cpp)."""
    return (re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "output") + ".npy"


def open_package(path: str | Path) -> PackageInfo:
    root = Path(path).resolve()
    mf = root / "manifest.json"
    if not mf.is_file():
        raise UserError(f"{root}: not a package (no manifest.json); build one with `pack build SPEC`")
    try:
        manifest = json.loads(mf.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{mf}: not valid JSON ({e})") from None
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != MANIFEST_VERSION:
        raise UserError(f"{mf}: not a version-{MANIFEST_VERSION} packager manifest")
    return PackageInfo(root, manifest)
