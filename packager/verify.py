"""`pack verify PKG`: run every CPU target of a package and compare it with onnxruntime.

Each target runs through the package's own packrt-run binary (ARM64 under qemu-aarch64 on an
x86 host), on seeded random inputs for every shape profile; onnxruntime's CPU EP on the source
model gives the reference. A target the host cannot execute is reported as skipped.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .emit.package import sha256_file
from .errors import InternalError, UserError
from .frontend import load_model, random_inputs
from .package_info import PackageInfo, open_package, output_file
from .targets import ARCHES, host_arch, host_cpu_flags

QEMU_SYSROOT = {"aarch64": "/usr/aarch64-linux-gnu"}


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


def runner_command(pkg: PackageInfo, target: dict) -> tuple[list[str] | None, str]:
    """How to execute packrt-run for `target` on this host: the command prefix, or None and why not."""
    arch = target["arch"]
    cli = str(pkg.cli(arch))
    if arch == host_arch():
        missing = set(target.get("cpu_features", [])) - host_cpu_flags()
        if missing:
            return None, f"this CPU lacks {' '.join(sorted(missing))}"
        return [cli], ""
    qemu = shutil.which(f"qemu-{arch}") or shutil.which(f"qemu-{arch}-static")
    if qemu is None:
        return None, f"needs qemu-{arch} to run {arch} code here (Debian/Ubuntu: apt-get install qemu-user)"
    sysroot = QEMU_SYSROOT.get(arch, f"/usr/{ARCHES[arch]}")
    if not Path(sysroot).is_dir():
        return None, f"needs the {arch} C library in {sysroot} (apt-get install g++-{ARCHES[arch]})"
    return [qemu, "-L", sysroot, cli], ""


def compare(ours: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> tuple[float, float, bool]:
    """Max abs error, max relative error and the allclose verdict (NaNs must match)."""
    if ours.shape != ref.shape or ours.dtype != ref.dtype:
        return float("inf"), float("inf"), False
    if ours.dtype == bool or np.issubdtype(ours.dtype, np.integer):
        diff = np.abs(ours.astype(np.int64) - ref.astype(np.int64)).astype(np.float64)
        return float(diff.max(initial=0)), float(diff.max(initial=0)), bool((diff == 0).all())
    a, b = ours.astype(np.float64), ref.astype(np.float64)
    diff = np.abs(a - b)
    diff[np.isnan(a) & np.isnan(b)] = 0
    rel = diff / np.maximum(np.abs(b), 1e-30)
    ok = bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))
    return float(np.nanmax(diff, initial=0)), float(np.nanmax(rel, initial=0)), ok


def run_package(cmd: list[str], pkg: PackageInfo, target: str, inputs: dict[str, np.ndarray], work: Path,
                extra: list[str] | None = None) -> dict[str, np.ndarray]:
    """Run packrt-run on `inputs`; returns the outputs by name."""
    work.mkdir(parents=True, exist_ok=True)
    args = []
    for i, (name, arr) in enumerate(inputs.items()):
        f = work / f"input{i}.npy"
        np.save(f, arr)
        args += ["--input", f"{name}={f}"]
    out_dir = work / "out"
    out_dir.mkdir(exist_ok=True)
    r = subprocess.run([*cmd, str(pkg.root), "--target", target, *args, "--output-dir", str(out_dir),
                        "--warmup", "0", "--iters", "1", *(extra or [])], capture_output=True, text=True)
    if r.returncode != 0:
        raise InternalError(f"packrt-run failed for target '{target}' (exit {r.returncode}): "
                            f"{(r.stderr or r.stdout).strip()[-1500:]}")
    return {o["name"]: np.load(out_dir / output_file(o["name"])) for o in pkg.manifest["outputs"]}


def reference_outputs(model_path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, inputs)))
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise InternalError(f"onnxruntime, the reference, cannot run {model_path}: {str(e).strip()[:500]}") from None


def find_model(pkg: PackageInfo, override: Path | None) -> Path:
    src = pkg.manifest["source_model"]
    path = Path(override) if override else Path(src["path"])
    if not path.is_file():
        raise UserError(f"source model {path} not found; pass --model PATH to the ONNX file the package was built from")
    if sha256_file(path) != src["sha256"]:
        raise UserError(f"{path} is not the model this package was built from (sha256 differs); "
                        "pass --model PATH to the original file")
    return path


def verify_package(path: Path, targets: list[str] | None = None, model: Path | None = None,
                   rtol: float | None = None, atol: float | None = None, log=print) -> list[TargetResult]:
    pkg = open_package(path)
    model_path = find_model(pkg, model)
    tol = pkg.manifest.get("verify", {})
    rtol = tol.get("rtol", 1e-4) if rtol is None else rtol
    atol = tol.get("atol", 1e-5) if atol is None else atol
    loaded = load_model(model_path)
    dtypes = {i["name"]: i["dtype"] for i in pkg.manifest["inputs"]}
    chosen = [pkg.target(n) for n in targets] if targets else pkg.targets
    results: list[TargetResult] = []
    with tempfile.TemporaryDirectory(prefix="pack-verify-") as tmp:
        for k, prof in enumerate(pkg.manifest["profiles"]):
            shapes = {n: tuple(s) for n, s in prof["inputs"].items()}
            inputs = random_inputs(loaded, shapes, dtypes, seed=k)
            ref = reference_outputs(model_path, inputs)
            for t in chosen:
                cmd, why = runner_command(pkg, t)
                if cmd is None:
                    results.append(TargetResult(t["name"], prof["name"], "skipped", why))
                    continue
                ours = run_package(cmd, pkg, t["name"], inputs, Path(tmp) / f"{t['name']}-{k}")
                checks = [OutputCheck(n, *compare(ours[n], ref[n], rtol, atol)) for n in ref]
                results.append(TargetResult(t["name"], prof["name"], "pass" if all(c.ok for c in checks) else "fail",
                                            outputs=checks))
    log(f"pack verify {pkg.name}: rtol {rtol:g}, atol {atol:g}, reference onnxruntime (CPU EP)")
    for r in results:
        if r.status == "skipped":
            log(f"  {r.target:14s} {r.profile:10s} SKIPPED  {r.reason}")
            continue
        for c in r.outputs:
            log(f"  {r.target:14s} {r.profile:10s} {'ok  ' if c.ok else 'FAIL'}    {c.name}: "
                f"max abs err {c.max_abs:.3g}, max rel err {c.max_rel:.3g}")
    return results
