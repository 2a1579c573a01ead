"""`pack verify PKG`: run every compiled target of a package and compare it with onnxruntime.

Each target runs through the package's own packrt-run binary (ARM64 under qemu-aarch64 on an
x86 host), on seeded random inputs for every shape profile; onnxruntime's CPU EP on the source
model gives the reference. For a model split between ONNX Runtime and compiled parts, the
reference run also returns every tensor that crosses a part boundary, so each part is checked on
its own, on every target. Then, where the package has a custom-op library for this machine, the
wrapper model ort/model.onnx runs in onnxruntime end to end. A target the host cannot execute is
reported as skipped.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..codegen.backend import backend_for
from ..emit.manifest import open_package
from ..errors import UserError
from ..frontend import load_model, random_inputs
from .runners import (cuda_ep_available, find_model, reference_outputs, run_package, runner_command, units_of,
                      wrapper_outputs)

ORT_CHECK = "onnxruntime"          # the row name of the end-to-end check through ort/model.onnx


@dataclass
class OutputCheck:
    name: str
    max_abs: float
    max_rel: float
    ok: bool


@dataclass
class TargetResult:
    target: str
    profile: str
    status: str                    # "pass" | "fail" | "skipped"
    reason: str = ""
    outputs: list[OutputCheck] = field(default_factory=list)
    part: str = ""


def compare(ours: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> tuple[float, float, bool]:
    """Max abs error, max relative error (relative to max(|ref|, atol), so values near zero do not
    dominate it) and the allclose verdict (NaNs must match)."""
    if ours.shape != ref.shape or ours.dtype != ref.dtype:
        return float("inf"), float("inf"), False
    if ours.dtype == bool or np.issubdtype(ours.dtype, np.integer):
        diff = np.abs(ours.astype(np.int64) - ref.astype(np.int64)).astype(np.float64)
        return float(diff.max(initial=0)), float(diff.max(initial=0)), bool((diff == 0).all())
    a, b = ours.astype(np.float64), ref.astype(np.float64)
    diff = np.abs(a - b)
    diff[np.isnan(a) & np.isnan(b)] = 0
    rel = diff / np.maximum(np.abs(b), max(atol, 1e-30))
    ok = bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))
    return float(np.nanmax(diff, initial=0)), float(np.nanmax(rel, initial=0)), ok


def verify_package(path: Path, targets: list[str] | None = None, model: Path | None = None,
                   rtol: float | None = None, atol: float | None = None, log=print) -> list[TargetResult]:
    pkg = open_package(path)
    model_path = find_model(pkg, model)
    tol = pkg.manifest.get("verify", {})
    rtol = tol.get("rtol", 1e-4) if rtol is None else rtol
    atol = tol.get("atol", 1e-5) if atol is None else atol
    loaded = load_model(model_path)
    dtypes = {i["name"]: i["dtype"] for i in pkg.manifest["inputs"]}
    units = units_of(pkg)
    boundary = [] if len(units) == 1 and not units[0][0] else sorted(
        {t["name"] for _, u in units for t in u.manifest["inputs"] + u.manifest["outputs"]})
    results: list[TargetResult] = []
    has_cuda = any(backend_for(t).reference_on_gpu() for _, u in units for t in u.manifest["targets"])
    gpu_ref = has_cuda and cuda_ep_available()
    with tempfile.TemporaryDirectory(prefix="pack-verify-") as tmp:
        for k, prof in enumerate(pkg.manifest["profiles"]):
            shapes = {n: tuple(s) for n, s in prof["inputs"].items()}
            inputs = random_inputs(loaded, shapes, dtypes, seed=k)
            cpu_ref = reference_outputs(model_path, inputs, boundary)
            cuda_ref = reference_outputs(model_path, inputs, boundary, cuda=True) if gpu_ref else cpu_ref
            for part, unit in units:
                names = [t["name"] for t in unit.manifest["targets"]]
                for name in targets or names:
                    if name not in names:
                        raise UserError(f"{unit.root}: no target '{name}' (targets: {', '.join(names)})")
                    t = unit.target(name)
                    ref = cuda_ref if backend_for(t).reference_on_gpu() else cpu_ref
                    cmd, why = runner_command(pkg, t)
                    if cmd is None:
                        results.append(TargetResult(name, prof["name"], "skipped", why, part=part))
                        continue
                    feeds = {i["name"]: ref[i["name"]] if i["name"] in ref else inputs[i["name"]]
                             for i in unit.manifest["inputs"]}
                    outs = [o["name"] for o in unit.manifest["outputs"]]
                    ours = run_package(cmd, unit.root, name, feeds, outs, Path(tmp) / f"{part}-{name}-{k}")
                    checks = [OutputCheck(n, *compare(ours[n], ref[n], rtol, atol)) for n in outs]
                    results.append(TargetResult(name, prof["name"], "pass" if all(c.ok for c in checks) else "fail",
                                                outputs=checks, part=part))
            if not targets:
                for row, on_cuda, ref in ((ORT_CHECK, False, cpu_ref), (ORT_CHECK + "-cuda", True, cuda_ref)):
                    if on_cuda and not gpu_ref:
                        continue
                    got = wrapper_outputs(pkg, inputs, cuda=on_cuda)
                    if isinstance(got, str):
                        results.append(TargetResult(row, prof["name"], "skipped", got))
                        continue
                    checks = [OutputCheck(o["name"], *compare(got[o["name"]], ref[o["name"]], rtol, atol))
                              for o in pkg.manifest["outputs"]]
                    results.append(TargetResult(row, prof["name"], "pass" if all(c.ok for c in checks)
                                                else "fail", outputs=checks))
    refs = "CPU EP" + (" for CPU targets, CUDA EP for CUDA targets" if gpu_ref else "")
    log(f"pack verify {pkg.name}: rtol {rtol:g}, atol {atol:g}, reference onnxruntime ({refs})")
    for r in results:
        label = f"{r.target} [{r.part}]" if r.part else r.target
        if r.status == "skipped":
            log(f"  {label:14s} {r.profile:10s} SKIPPED  {r.reason}")
            continue
        for c in r.outputs:
            log(f"  {label:14s} {r.profile:10s} {'ok  ' if c.ok else 'FAIL'}    {c.name}: "
                f"max abs err {c.max_abs:.3g}, max rel err {c.max_rel:.3g}")
    return results
