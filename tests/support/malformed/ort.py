"""The same variants through ONNX Runtime: the package's wrapper model (re-pinned to the damaged
copy's manifest after re-signing, so the loader's own checks are what is tested) in a fresh
Python process per variant (a crash must not take the runner down), with the package's custom-op
library. A clean refusal is one stderr line "ort: error: ..." (the exception ONNX Runtime raises
at session creation or run) and exit 2; a run writes NAME.npy per output like packrt-run."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .mutations import Case
from .process import spawn

# Variant classes that only concern packrt-run (its .npy reader and --threads option).
PACKRT_RUN_ONLY = {"npy-input", "threads"}
PREFIX = "ort: error:"

CHILD = r"""
import re, sys
from pathlib import Path
import numpy as np
import onnxruntime as ort
pkg, lib, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
feeds = {k: np.load(v) for k, v in (a.split("=", 1) for a in sys.argv[4:])}
try:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.add_session_config_entry("ai.packager.model_dir", str(pkg / "ort"))   # read at registration
    so.register_custom_ops_library(lib)
    s = ort.InferenceSession(str(pkg / "ort" / "model.onnx"), so, providers=["CPUExecutionProvider"])
    results = s.run(None, feeds)
except Exception as e:
    print("ort: error: " + str(e), file=sys.stderr)
    sys.exit(2)
out.mkdir(parents=True, exist_ok=True)
for o, r in zip(s.get_outputs(), results):
    np.save(out / (re.sub(r"[^A-Za-z0-9_.-]", "_", o.name) + ".npy"), r)
"""


def library(package: Path) -> Path:
    """The package's custom-op library for this machine."""
    return package / "ort" / os.uname().machine / "libpackager_ort.so"


def ignore_for_copy(base: Path):
    """copytree's ignore: no runtime/, and of ort/ only the wrapper model (the library is used
    from the undamaged package)."""
    def ignore(d: str, names: list[str]) -> list[str]:
        if Path(d) == base:
            return [n for n in names if n == "runtime"]
        if Path(d) == base / "ort":
            return [n for n in names if n != "model.onnx"]
        return []
    return ignore


def execute_ort(lib: Path, case: Case, out_dir: Path, timeout: float):
    """Runs the wrapper of the case's package in ONNX Runtime; (returncode or None on timeout,
    stderr, seconds)."""
    cmd = [sys.executable, "-c", CHILD, str(case.pkg), str(lib), str(out_dir)]
    cmd += [f"{name}={path}" for name, path in case.inputs.items()]
    return spawn(cmd, timeout)
