"""reference/: seeded inputs and onnxruntime's (CPU EP) outputs per profile, stored in the package
so that it can check itself where it runs, with no Python (`packrt-run PKG --check`), and so that
`pack verify` needs no second reference run.

Every (sub-)package that runs on its own gets one: the whole model's, or each compiled part's
(its boundary tensors) and the root's (the wrapper model's inputs and outputs). Layout, relative
to that package's folder:
  reference/reference.json   {format "packager-reference", version 1, source, rtol, atol, flips, steps, spread,
                              profiles [{name, inputs {name: file}, outputs {name: file}}],
                              targets {name: {precision, rtol, atol}} (reduced-precision targets only)}
  reference/<profile>/in-<k>.npy, out-<k>.npy   (k: the tensor's index; names may not be file names)
The inputs are verify's (random_inputs, seed = the profile's index, verify.inputs applied), so
`pack verify` and `--check` compare the same thing. Listed and hashed in the manifest like every file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..errors import PackagerError, UserError
from ..frontend import profile_shapes, random_inputs
from ..frontend.ort_run import model_reference
from ..frontend.rounding import flips_for, quantization_steps, reference_spread
from ..spec import VerifySpec

REFERENCE_FILE = "reference/reference.json"
REFERENCE_FORMAT, REFERENCE_VERSION = "packager-reference", 1
AUTO_LIMIT = 16 << 20          # verify.reference: auto stores references up to this many bytes


@dataclass
class UnitReference:
    """One (sub-)package's reference tensors: per profile, (name, inputs, outputs)."""

    rel: str
    profiles: list[tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]] = field(default_factory=list)
    flips: float = 0.0             # share of elements a re-quantizing model may have a rounding step off
    steps: dict[str, float] = field(default_factory=dict)   # output -> quantization step (frontend/rounding.py)
    spread: dict[str, float] = field(default_factory=dict)  # output -> the reference's move under float noise


@dataclass
class References:
    units: list[UnitReference]
    nbytes: int
    skipped: str = ""              # why nothing is stored (empty: stored)

    def summary(self) -> str:
        if self.skipped:
            return f"reference data not stored: {self.skipped}"
        n = sum(len(u.profiles) for u in self.units)
        return (f"reference data stored: {n} profile run(s) over {len(self.units)} package(s), "
                f"{self.nbytes / 1e6:.2f} MB (packrt-run PKG --check)")


def compute_references(spec, model, dtypes: dict[str, str], units, split) -> References:
    """Runs onnxruntime on the source model for every profile (unless verify.reference is false,
    or auto and the tensors would exceed AUTO_LIMIT)."""
    mode = spec.verify.reference
    if mode is False:
        return References([], 0, "verify.reference is false")
    boundary = sorted({n for u in units for n in [i.name for i in u.model.inputs] + [o.name for o in u.model.outputs]}
                      ) if split is not None else []
    inlined = model.proto if model.control_flow and model.control_flow.inlined else None
    rels = [u.rel for u in units] + ([""] if split is not None else [])
    out = {rel: UnitReference(rel) for rel in rels}
    total, spread = 0, {}
    quantizing = flips_for(model.proto) > 0
    for k, prof in enumerate(spec.profiles):
        inputs = random_inputs(model, profile_shapes(model, prof), dtypes, seed=k, values=spec.verify.inputs)
        try:
            ref = model_reference(model.path, inputs, boundary, inlined)
        except PackagerError as e:        # e.g. an IR version this onnxruntime does not read yet
            return References([], 0, f"onnxruntime cannot run the model ({str(e).splitlines()[0][:300]})")
        if quantizing:
            moved = reference_spread(lambda feeds: model_reference(model.path, feeds, boundary, inlined), inputs, ref)
            spread.update({n: max(v, spread.get(n, 0.0)) for n, v in moved.items()})
        known = {**inputs, **ref}
        for u in units:
            unit_in = {i.name: known[i.name] for i in u.model.inputs}
            unit_out = {o.name: ref[o.name] for o in u.model.outputs}
            out[u.rel].profiles.append((prof.name, unit_in, unit_out))
        if split is not None:
            out[""].profiles.append((prof.name, inputs, {o.name: ref[o.name] for o in model.outputs}))
        total += sum(a.nbytes for u in out.values() for a in [*u.profiles[-1][1].values(), *u.profiles[-1][2].values()])
        if mode == "auto" and total > AUTO_LIMIT:
            return References([], total, f"over {AUTO_LIMIT >> 20} MB (verify.reference: true stores it anyway)")
    steps = quantization_steps(model.proto)
    for u in out.values():
        u.flips = flips_for(model.proto)
        compared = {n for _, _, outs in u.profiles for n in outs}
        u.steps = {n: s for n, s in steps.items() if n in compared}
        u.spread = {n: s for n, s in spread.items() if n in compared}
    return References(list(out.values()), total)


def write_reference(w, ref: UnitReference, verify: VerifySpec, precisions: dict[str, str]) -> None:
    """reference/ of one (sub-)package, through the package writer `w`. A target built in reduced
    precision gets its own tolerance under `targets` (packrt-run --check reads it)."""
    rtol, atol = verify.tolerance()
    profiles = []
    for pname, inputs, outputs in ref.profiles:
        entry = {"name": pname, "inputs": {}, "outputs": {}}
        for kind, prefix, tensors in (("inputs", "in", inputs), ("outputs", "out", outputs)):
            for k, (name, arr) in enumerate(tensors.items()):
                rel = f"reference/{pname}/{prefix}-{k}.npy"
                np.save(w.path(_under(ref.rel, rel)), np.array(arr, order="C"), allow_pickle=False)   # keeps 0-d
                entry[kind][name] = rel
        profiles.append(entry)
    doc = {"format": REFERENCE_FORMAT, "version": REFERENCE_VERSION,
           "source": f"onnxruntime {ort.__version__}, CPU execution provider, basic graph optimizations",
           "rtol": rtol, "atol": atol, "flips": ref.flips, "steps": ref.steps, "spread": ref.spread,
           "profiles": profiles}
    reduced = {t: p for t, p in precisions.items() if p != "fp32"}
    if reduced:
        doc["targets"] = {t: dict(zip(("rtol", "atol"), verify.tolerance(p)), precision=p)
                          for t, p in reduced.items()}
    w.write_text(_under(ref.rel, REFERENCE_FILE), json.dumps(doc, indent=1) + "\n")


def _under(rel: str, path: str) -> str:
    return f"{rel}/{path}" if rel else path


# ---- reader -------------------------------------------------------------------------------------

def _reference_doc(root: Path, manifest: dict) -> tuple[Path, dict] | None:
    """reference.json of the (sub-)package at `root` and its path, or None when it has none."""
    rel = manifest.get("reference")
    if not rel:
        return None
    base = root.resolve()
    path = (base / rel).resolve()
    if base not in path.parents:
        raise UserError(f"{root}/manifest.json: reference path '{rel}' leaves the package")
    try:
        return path, json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: unreadable reference data ({e}); rebuild the package") from None


def read_spread(root: Path, manifest: dict) -> dict[str, float] | None:
    """The stored reference's spread (frontend/rounding.py), or None when the package has no
    reference or was built before the spread was stored."""
    found = _reference_doc(root, manifest)
    return None if found is None or "spread" not in found[1] else dict(found[1]["spread"])


def read_reference(root: Path, manifest: dict) -> dict[str, tuple[dict, dict]] | None:
    """The stored reference of the (sub-)package at `root`: profile name -> (inputs, outputs), or
    None when it has none. Paths stay inside the package."""
    found = _reference_doc(root, manifest)
    if found is None:
        return None
    path, doc = found
    base = root.resolve()
    try:
        out = {}
        for p in doc["profiles"]:
            load = {k: (base / v).resolve() for kind in ("inputs", "outputs") for k, v in p[kind].items()}
            if any(base not in f.parents for f in load.values()):
                raise UserError(f"{path}: a reference file leaves the package")
            out[p["name"]] = ({k: np.load(base / v, allow_pickle=False) for k, v in p["inputs"].items()},
                              {k: np.load(base / v, allow_pickle=False) for k, v in p["outputs"].items()})
        return out
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path}: unreadable reference data ({e}); rebuild the package") from None
