"""README's main job runs verbatim: its shell block, copied line by line, in a fresh copy of the
samples (so nothing of the checkout is written), with `pack` and `python` as a new user has them."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from support.helpers import REPO

pytestmark = pytest.mark.slow


def main_job_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## The main job, on a bundled sample", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def test_the_main_job_block_runs_verbatim(tmp_path):
    block = main_job_block()
    assert "pack build samples/cnn/spec.yaml" in block and "--input image=x.npy" in block
    work = tmp_path / "checkout"
    shutil.copytree(REPO / "samples", work / "samples", ignore=shutil.ignore_patterns("dist", "*.onnx", "zoo"))
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=work, capture_output=True, text=True,
                       timeout=1500)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    pkg = work / "samples" / "cnn" / "dist" / "cnn"
    assert (pkg / "report.html").is_file() and (pkg / "bench.json").is_file()
    outputs = list((work / "out").glob("*.npy"))
    assert len(outputs) == 1 and np.isfinite(np.load(outputs[0])).all()
    assert "ok" in r.stdout and "latency" in r.stdout
