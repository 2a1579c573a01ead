"""Running a package on this machine: packrt-run for one target (natively, under qemu, on the local
GPU: the target's backend says how) and the package's ORT wrapper model (onnxruntime on the source
model, the reference, is frontend/ort_run.py). verify, bench and conformance share these."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from ..codegen.backend import backend_for
from ..emit.manifest import PackageInfo, open_package, output_file, sha256_file
from ..errors import InternalError, UserError
from ..frontend.ort_run import ort_session, run_all
from ..targets import host_arch


def runner_command(pkg: PackageInfo, target: dict) -> tuple[list[str] | None, str]:
    """How to execute packrt-run for `target` on this host: the command prefix, or None and why not."""
    return backend_for(target).runner(pkg, target)


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


def wrapper_outputs(pkg: PackageInfo, inputs: dict[str, np.ndarray], cuda: bool = False) -> dict[str, np.ndarray] | str:
    """ort/model.onnx in onnxruntime (CPU or CUDA EP) with the package's custom-op library, or why
    it cannot run."""
    lib = pkg.manifest.get("ort", {}).get("library", {}).get(host_arch())
    if not lib:
        return f"no custom-op library for {host_arch()} in the package"
    sess = ort_session(str(pkg.root / pkg.manifest["ort"]["model"]), library=pkg.root / lib, cuda=cuda)
    return run_all(sess, inputs)


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
