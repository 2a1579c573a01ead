"""Packages written by hand around a small kernels.so (C kernels or TVM's, linked with the
packager's glue): one target (x86-64), one profile, one kernel step over float32 vectors. For
runtime tests that need a kernel doing something no model would (failing in a worker, writing its
weights, holding the pool's threads)."""
from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import numpy as np

from .helpers import REPO

GLUE = REPO / "runtime_cpp" / "kernel_glue" / "packrt_kernel_glue.c"


def compile_kernels(source: str, out: Path) -> Path:
    """C kernels + the glue -> a kernels.so as the packager links it."""
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-Wl,-Bsymbolic", "-o", str(out), str(src), str(GLUE)],
                   check=True)
    src.unlink()
    return out


def _sha(p: Path) -> dict:
    data = p.read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def synthetic_package(root: Path, symbol: str, input_storage: str = "arena", *, kernels_c: str | None = None,
                      kernels_so: Path | None = None, n: int = 4, scratch: bool = False,
                      kernel_fields: dict | None = None) -> Path:
    """A one-step package running kernel `symbol` on (x, [scratch,] y), float32[n] each: x is the
    input `x` (in the arena) or a weight (`input_storage="weights"`, holding 0..), y the output `y`.
    The kernels come from C source (`kernels_c`) or a linked kernels.so (`kernels_so`)."""
    tdir = root / "targets" / "x86-64"
    tdir.mkdir(parents=True)
    if kernels_so is not None:
        (tdir / "kernels.so").write_bytes(kernels_so.read_bytes())
    else:
        compile_kernels(kernels_c or "", tdir / "kernels.so")
    nbytes = 4 * n
    slot = (nbytes + 63) // 64 * 64
    (tdir / "weights.bin").write_bytes(np.arange(slot // 4, dtype=np.float32).tobytes())
    t = {"dtype": "float32", "shape": [n], "bytes": nbytes}
    tensors = [dict(t, storage="arena", offset=0), dict(t, storage="arena", offset=slot),
               dict(t, storage="weights", offset=0), dict(t, storage="arena", offset=2 * slot)]
    src_id = 0 if input_storage == "arena" else 2
    args = [src_id, 3, 1] if scratch else [src_id, 1]
    plan = {"format": "packager-plan", "version": 3, "target": "x86-64", "device": "cpu",
            "weights": {"file": "weights.bin", "bytes": slot},
            "kernels": [{"name": symbol, "symbol": f"__tvm_ffi_{symbol}", "num_args": len(args),
                         **(kernel_fields or {})}],
            "profiles": [{"name": "default", "arena_bytes": 3 * slot, "tensors": tensors,
                          "inputs": [{"name": "x", "tensor": 0}], "outputs": [{"name": "y", "tensor": 1}],
                          "steps": [{"op": "kernel", "kernel": 0, "args": args, "outputs": len(args) - 1}]}]}
    (tdir / "plan.json").write_text(json.dumps(plan))
    files = {f"targets/x86-64/{f}": _sha(tdir / f) for f in ("plan.json", "kernels.so", "weights.bin")}
    manifest = {"format": "packager-package", "version": 1, "name": "synthetic", "id": "synthetic",
                "inputs": [{"name": "x", "dtype": "float32", "shape": [n]}],
                "outputs": [{"name": "y", "dtype": "float32", "shape": [n]}],
                "targets": [{"name": "x86-64", "kind": "cpu", "arch": "x86_64", "isa": "x86-64", "cpu_features": [],
                             "path": "targets/x86-64", "plan": "targets/x86-64/plan.json",
                             "weights": "targets/x86-64/weights.bin", "kernels": "targets/x86-64/kernels.so"}],
                "files": files}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root
