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

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from .emit.package import sha256_file
from .errors import InternalError, UserError
from .frontend import load_model, random_inputs
from .package_info import PackageInfo, open_package, output_file
from .targets import ARCHES, host_arch, host_cpu_flags, local_cuda_sm

QEMU_SYSROOT = {"aarch64": "/usr/aarch64-linux-gnu"}
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


def runner_command(pkg: PackageInfo, target: dict) -> tuple[list[str] | None, str]:
    """How to execute packrt-run for `target` on this host: the command prefix, or None and why not."""
    arch = target["arch"]
    cli = str(pkg.cli(arch))
    if target.get("kind") == "cuda":
        if arch != host_arch():
            return None, f"its runtime is built for an {arch} host (e.g. the Jetson itself), this machine is {host_arch()}"
        sm, why = local_cuda_sm()
        if sm is None:
            return None, why
        want = int(str(target["sm"]).split("_")[1])
        if sm < want:
            return None, f"needs a GPU of {target['sm']} or newer, this one is sm_{sm}"
        return [cli], ""
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


def run_package(cmd: list[str], folder: Path, target: str, inputs: dict[str, np.ndarray], outputs: list[str],
                work: Path, extra: list[str] | None = None) -> dict[str, np.ndarray]:
    """Run packrt-run on the package (or part) in `folder`; returns the outputs by name."""
    work.mkdir(parents=True, exist_ok=True)
    args = []
    for i, (name, arr) in enumerate(inputs.items()):
        f = work / f"input{i}.npy"
        np.save(f, arr)
        args += ["--input", f"{name}={f}"]
    out_dir = work / "out"
    out_dir.mkdir(exist_ok=True)
    r = subprocess.run([*cmd, str(folder), "--target", target, *args, "--output-dir", str(out_dir),
                        "--warmup", "0", "--iters", "1", *(extra or [])], capture_output=True, text=True)
    if r.returncode != 0:
        raise InternalError(f"packrt-run failed for target '{target}' (exit {r.returncode}): "
                            f"{(r.stderr or r.stdout).strip()[-1500:]}")
    return {name: np.load(out_dir / output_file(name)) for name in outputs}


def ort_session(model: str | bytes, threads: int = 0, library: Path | None = None, cuda: bool = False):
    """An onnxruntime session (quiet logs) on the CPU EP, or with `cuda` on the CUDA EP (an error
    if onnxruntime cannot use it: it would fall back to the CPU silently); `library`: our
    custom-op library, registered with the same thread count for the packaged parts."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    if library is not None:
        if threads:
            so.add_session_config_entry("ai.packager.num_threads", str(threads))
        so.register_custom_ops_library(str(library))
    if not cuda:
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    sess = ort.InferenceSession(model, so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    if "CUDAExecutionProvider" not in sess.get_providers():
        raise UserError("onnxruntime cannot use its CUDA execution provider here (install onnxruntime-gpu with a "
                        "matching CUDA runtime)")
    return sess


def cuda_ep_available() -> bool:
    import onnxruntime as ort
    return "CUDAExecutionProvider" in ort.get_available_providers() and local_cuda_sm()[0] is not None


def _run_all(sess, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs)))


def reference_outputs(model_path: Path, inputs: dict[str, np.ndarray], extra: list[str] = (),
                      cuda: bool = False) -> dict[str, np.ndarray]:
    """onnxruntime (CPU EP, or CUDA EP) on the source model; `extra` intermediate tensors are returned too."""
    try:
        model: str | bytes = str(model_path)
        if extra:
            proto = onnx.load(str(model_path))
            have = {o.name for o in proto.graph.output}
            proto.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in extra if n not in have)
            model = proto.SerializeToString()
        return _run_all(ort_session(model, cuda=cuda), inputs)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise InternalError(f"onnxruntime, the reference, cannot run {model_path}: {str(e).strip()[:500]}") from None


def wrapper_outputs(pkg: PackageInfo, inputs: dict[str, np.ndarray], cuda: bool = False) -> dict[str, np.ndarray] | str:
    """ort/model.onnx in onnxruntime (CPU or CUDA EP) with the package's custom-op library, or why
    it cannot run."""
    lib = pkg.manifest.get("ort", {}).get("library", {}).get(host_arch())
    if not lib:
        return f"no custom-op library for {host_arch()} in the package"
    sess = ort_session(str(pkg.root / pkg.manifest["ort"]["model"]), library=pkg.root / lib, cuda=cuda)
    return _run_all(sess, inputs)


def find_model(pkg: PackageInfo, override: Path | None) -> Path:
    src = pkg.manifest["source_model"]
    path = Path(override) if override else Path(src["path"])
    if not path.is_file():
        raise UserError(f"source model {path} not found; pass --model PATH to the ONNX file the package was built from")
    if sha256_file(path) != src["sha256"]:
        raise UserError(f"{path} is not the model this package was built from (sha256 differs); "
                        "pass --model PATH to the original file")
    return path


def units_of(pkg: PackageInfo) -> list[tuple[str, PackageInfo]]:
    """(part name, its package info): the package itself, or each compiled part."""
    if "parts" in pkg.manifest:
        return [(p["name"], open_package(pkg.root / p["path"])) for p in pkg.manifest["parts"]]
    return [("", pkg)]


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
    has_cuda = any(t.get("kind") == "cuda" for _, u in units for t in u.manifest["targets"])
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
                    ref = cuda_ref if t.get("kind") == "cuda" else cpu_ref
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
