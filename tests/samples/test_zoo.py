"""The benchmark zoo builds for x86-64 and matches onnxruntime (`pack verify`) for every model."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from support.helpers import REPO, run_pack

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo")


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2", "bert_base", "gpt2_small", "vit_tiny"])
def test_zoo_model_builds_and_verifies(zoo, name):
    r = subprocess.run([sys.executable, str(REPO / "samples" / "zoo" / "make_zoo.py"), name, "--out", str(zoo)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = run_pack("build", zoo / name / "spec.yaml")
    assert r.returncode == 0, r.stderr
    assert "(0 left unscheduled)" not in r.stdout and "left unscheduled" not in r.stdout
    r = run_pack("verify", zoo / name / "dist" / name)
    assert r.returncode == 0, r.stdout + r.stderr
    shutil.rmtree(zoo / name)                                 # keep the CI disk footprint small
