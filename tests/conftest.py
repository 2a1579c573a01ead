"""Shared fixtures (sample models in a temp folder, packages built once per session, inputs) and
the test tiers; helpers are in support/."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))               # tests/ (for support/)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "samples"))

from make_samples import SAMPLES, write_samples  # noqa: E402
from support.helpers import REPO  # noqa: E402


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



@pytest.fixture
def cnn_copy(packages, tmp_path) -> Path:
    """A copy of the cnn package a test may damage."""
    dst = tmp_path / "cnn"
    shutil.copytree(packages["cnn"], dst, symlinks=True)
    return dst
