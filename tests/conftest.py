"""Shared fixtures: sample models in a temp folder, packages built once per session, CLI runner."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "samples"))

from make_samples import SAMPLES, write_samples  # noqa: E402

HAS_QEMU = shutil.which("qemu-aarch64") is not None and Path("/usr/aarch64-linux-gnu").is_dir()


# Fixtures that build whole packages: a test using one is not in the fast tier.
PACKAGE_FIXTURES = {"packages", "cuda_packages"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items) -> None:
    """Tiers: `slow` builds whole packages, `gpu` needs a GPU, `fast` is everything else (no
    package is built: `pytest -m fast` runs in a few minutes)."""
    for item in items:
        if not any(item.get_closest_marker(m) for m in ("slow", "gpu")) and \
                not PACKAGE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.fast)


def run_pack(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the `pack` CLI in a subprocess (as a user would)."""
    return subprocess.run([sys.executable, "-m", "packager.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


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


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory) -> Path:
    """A copy of samples/ with the sample models generated."""
    root = tmp_path_factory.mktemp("samples")
    for name in SAMPLES:
        (root / name).mkdir()
        shutil.copy(REPO / "samples" / name / "spec.yaml", root / name / "spec.yaml")
    write_samples(root=root)
    return root


@pytest.fixture(scope="session")
def packages(sample_root) -> dict[str, Path]:
    """Every sample built for its spec's targets (x86-64 + arm64), once per session."""
    from packager.build import build
    from packager.spec import load_spec

    out = {}
    for name in SAMPLES:
        spec = load_spec(sample_root / name / "spec.yaml")
        out[name] = build(spec, log=lambda _msg: None)
    return out


@pytest.fixture(scope="session")
def cnn_input(tmp_path_factory) -> tuple[Path, np.ndarray]:
    x = np.random.default_rng(7).standard_normal((1, 3, 64, 64)).astype(np.float32)
    p = tmp_path_factory.mktemp("inputs") / "image.npy"
    np.save(p, x)
    return p, x


def ort_run(model_path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))
