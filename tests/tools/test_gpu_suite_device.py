"""The device half of the GPU suite, the parts that need no GPU: it finds the cooperative
(grid-synchronized) kernels of a target, which it then runs under compute-sanitizer."""
from __future__ import annotations

import json
from pathlib import Path

from packager.tools.gpu_suite_device import cooperative_kernels


def _package(root: Path, launches: list[dict]) -> Path:
    (root / "targets" / "h100").mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps({"targets": [{"name": "h100", "plan": "targets/h100/plan.json"}]}))
    plan = {"kernels": [{"name": "k", "launches": launches}]}
    (root / "targets" / "h100" / "plan.json").write_text(json.dumps(plan))
    return root


def test_cooperative_kernels_are_counted_per_target(tmp_path):
    pkg = _package(tmp_path / "a", [{"function": "k_grid", "cooperative": True}, {"function": "k2"}])
    assert cooperative_kernels(pkg, "h100") == 1
    assert cooperative_kernels(pkg, "a100") == 0                  # not in this package
    plain = _package(tmp_path / "b", [{"function": "k", "cooperative": False}])
    assert cooperative_kernels(plain, "h100") == 0
