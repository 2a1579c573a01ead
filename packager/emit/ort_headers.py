"""ONNX Runtime's C/C++ API headers, needed to build the custom-op library.

ORT's pip wheels ship no headers. Debian trixie's libonnxruntime-dev (ORT 1.21, API 21, MIT)
has them: the .deb is fetched with apt-get using a private sources list and state folder under
the packager cache (nothing in /etc/apt changes), unpacked once, and reused by every build.
PACKAGER_ORT_INCLUDE may point at an existing folder with onnxruntime_cxx_api.h instead.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..cache import cache_dir, filling, locked

DEB = "libonnxruntime-dev"
SOURCES = "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main\n"
HEADER = "onnxruntime_cxx_api.h"


def _apt(root: Path) -> list[str]:
    return ["apt-get", "-qq", "-o", f"Dir::Etc::sourcelist={root / 'sources.list'}", "-o", "Dir::Etc::sourceparts=-",
            "-o", f"Dir::State::Lists={root / 'lists'}", "-o", f"Dir::Cache={root / 'cache'}",
            "-o", "APT::Sandbox::User=root"]


def ort_headers() -> tuple[Path | None, str]:
    """The folder holding onnxruntime_cxx_api.h, or None and the reason it is unavailable."""
    env = os.environ.get("PACKAGER_ORT_INCLUDE")
    if env:
        return (Path(env), "") if (Path(env) / HEADER).is_file() else (None, f"PACKAGER_ORT_INCLUDE={env} has no {HEADER}")
    root = cache_dir() / "ort-headers"
    include = root / "include" / "onnxruntime"
    if (include / HEADER).is_file():
        return include, ""
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        return None, "apt-get/dpkg not found (set PACKAGER_ORT_INCLUDE to ONNX Runtime's include folder)"
    with locked(root.with_suffix(".lock")):
        if (include / HEADER).is_file():
            return include, ""
        work, staged = root.with_name("ort-headers.tmp"), root.with_name("ort-headers.new")
        with filling(work, staged):
            return _fetch(root, work, staged)


def _fetch(root: Path, work: Path, staged: Path) -> tuple[Path | None, str]:
    """Download and unpack the .deb in `work`, stage the headers in `staged`, then move them to
    `root` in one rename (the header's presence marks a complete entry, so it must appear last)."""
    include = root / "include" / "onnxruntime"
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(staged, ignore_errors=True)
    for d in ("lists/partial", "cache/archives/partial", "deb"):
        (work / d).mkdir(parents=True)
    (work / "sources.list").write_text(SOURCES)
    steps = [(_apt(work) + ["update"], None), (_apt(work) + ["download", DEB], work / "deb")]
    for cmd, cwd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)
        if r.returncode != 0:
            shutil.rmtree(work, ignore_errors=True)
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
            return None, f"fetching {DEB} from Debian trixie failed: {tail[0]}"
    debs = list((work / "deb").glob(f"{DEB}_*.deb"))
    r = subprocess.run(["dpkg", "-x", str(debs[0]), str(work / "x")], capture_output=True, text=True)
    found = list((work / "x").rglob(HEADER))
    if r.returncode != 0 or not found:
        shutil.rmtree(work, ignore_errors=True)
        return None, f"{debs[0].name} has no {HEADER}"
    shutil.copytree(found[0].parent, staged / "include" / "onnxruntime")
    (staged / "SOURCE").write_text(f"{debs[0].name} from {SOURCES}")
    shutil.rmtree(root, ignore_errors=True)
    staged.rename(root)
    shutil.rmtree(work, ignore_errors=True)
    return include, ""
