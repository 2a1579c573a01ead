"""Helpers the tests share: the repository root, the `pack` CLI as a user runs it, spec and model
files, onnxruntime as the reference."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parents[2]
HAS_QEMU = shutil.which("qemu-aarch64") is not None and Path("/usr/aarch64-linux-gnu").is_dir()


def run_pack(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the `pack` CLI in a subprocess (as a user would), with `env` added to the environment."""
    return subprocess.run([sys.executable, "-m", "packager.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})})


def assert_clean_error(r: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    """A user-facing failure: the exit code, one line on stderr, no traceback, the key words."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


def write_spec(folder: Path, text: str, name: str = "spec.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(text)
    return p


def save_model(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def ort_run(model_path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))
