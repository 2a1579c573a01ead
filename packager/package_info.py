"""Reading a built package from Python: its manifest, targets and runtime binaries."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .emit.package import MANIFEST_FORMAT, MANIFEST_VERSION, sha256_file
from .errors import UserError


@dataclass
class PackageInfo:
    root: Path
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def targets(self) -> list[dict[str, Any]]:
        return self.manifest["targets"]

    def target(self, name: str) -> dict[str, Any]:
        for t in self.targets:
            if t["name"] == name:
                return t
        raise UserError(f"{self.root}: no target '{name}' (targets: {', '.join(t['name'] for t in self.targets)})")

    def cli(self, arch: str) -> Path:
        entry = self.manifest.get("runtime", {}).get(arch)
        if not entry:
            raise UserError(f"{self.root}: the package has no runtime for {arch}")
        return self.root / entry["cli"]

    def check_files(self) -> list[str]:
        """Problems with the package's files (missing, wrong size, wrong sha256); empty if intact."""
        problems = []
        for rel, f in self.manifest.get("files", {}).items():
            p = self.root / rel
            if not p.is_file():
                problems.append(f"{rel}: missing")
            elif p.stat().st_size != f["bytes"]:
                problems.append(f"{rel}: {p.stat().st_size} bytes, manifest says {f['bytes']}")
            elif sha256_file(p) != f["sha256"]:
                problems.append(f"{rel}: sha256 mismatch")
        return problems


def output_file(name: str) -> str:
    """The .npy file name packrt-run writes for output `name` (same rule as tools/packrt_run.cpp)."""
    return (re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "output") + ".npy"


def open_package(path: str | Path) -> PackageInfo:
    root = Path(path).resolve()
    mf = root / "manifest.json"
    if not mf.is_file():
        raise UserError(f"{root}: not a package (no manifest.json); build one with `pack build SPEC`")
    try:
        manifest = json.loads(mf.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{mf}: not valid JSON ({e})") from None
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != MANIFEST_VERSION:
        raise UserError(f"{mf}: not a version-{MANIFEST_VERSION} packager manifest")
    return PackageInfo(root, manifest)
