"""Malformed packages (tests/support/malformed/): packrt-run, built with ASan + UBSan, must refuse
every damaged variant of the cnn package with one clean error line, or run it correctly; never
crash, hang, trip a sanitizer, give wrong outputs or fail with a messy error.

By hand: PYTHONPATH=tests python -m support.malformed --sanitized --table malformed.md PKG
"""
from __future__ import annotations

from pathlib import Path

import pytest

from support.malformed import CLASSES, build_sanitized_runtime, run_variants

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def sanitized_runtime() -> Path:
    return build_sanitized_runtime()


def test_malformed_packages_are_refused_cleanly(packages, cnn_input, sanitized_runtime, tmp_path):
    table = tmp_path / "malformed.md"
    rows = run_variants(packages["cnn"], {"image": cnn_input[0]}, table=table, runtime=sanitized_runtime,
                        work=tmp_path / "variants", timeout=20)
    assert len(rows) >= 60, len(rows)
    assert {r.cls for r in rows} == set(CLASSES), set(CLASSES) - {r.cls for r in rows}
    bad = [r for r in rows if r.outcome not in ("clean", "correct")]
    assert not bad, (f"{len(bad)} of {len(rows)} malformed variants were neither refused cleanly nor run correctly "
                     f"(table: {table}; their folders are kept beside it):\n"
                     + "\n".join(f"  {r.name} [{r.cls}]: {r.outcome} (exit {r.exit}) {r.message[:200]}" for r in bad))


def test_malformed_packages_are_refused_cleanly_in_onnxruntime(packages, cnn_input, tmp_path):
    """The same variants (less packrt-run's own .npy and --threads ones) through the wrapper model
    and the custom-op library, one Python process per variant (not sanitized: ONNX Runtime is not)."""
    table = tmp_path / "malformed-ort.md"
    rows = run_variants(packages["cnn"], {"image": cnn_input[0]}, table=table, work=tmp_path / "variants",
                        timeout=60, engine="onnxruntime")
    assert len(rows) >= 60, len(rows)
    bad = [r for r in rows if r.outcome not in ("clean", "correct")]
    assert not bad, (f"{len(bad)} of {len(rows)} malformed variants were neither refused cleanly nor run correctly "
                     f"in onnxruntime (table: {table}):\n"
                     + "\n".join(f"  {r.name} [{r.cls}]: {r.outcome} (exit {r.exit}) {r.message[:200]}" for r in bad))
