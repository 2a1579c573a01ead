"""Writing a package folder atomically (the manifest's contents come from manifest.py).

Everything is written into a temporary sibling folder; only a complete package replaces the
destination, so a failed build leaves no partial output behind (and keeps any older package).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import InternalError, UserError
from .manifest import MANIFEST_FORMAT, MANIFEST_VERSION, sha256_file

class PackageWriter:
    """Stage files under a temporary folder, then move the finished package into place."""

    def __init__(self, dest: Path):
        if dest.exists() and not (dest / "manifest.json").is_file():
            raise UserError(f"output folder {dest} exists and is not a package; remove it or choose another --output")
        self.dest = dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.root = dest.parent / f".{dest.name}.partial-{os.getpid()}"
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir()

    def path(self, rel: str) -> Path:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def write_json(self, rel: str, obj: Any) -> Path:
        p = self.path(rel)
        p.write_text(json.dumps(obj, indent=1, sort_keys=False) + "\n")
        return p

    def write_text(self, rel: str, text: str) -> Path:
        p = self.path(rel)
        p.write_text(text)
        return p

    def copy(self, src: Path, rel: str) -> Path:
        p = self.path(rel)
        shutil.copy2(src, p)
        return p

    def copytree(self, src: Path, rel: str) -> Path:
        p = self.path(rel)
        shutil.copytree(src, p, dirs_exist_ok=True)
        return p

    def files(self, under: str = "") -> dict[str, dict[str, Any]]:
        """sha256 and size of every file below `under`, keyed by path relative to it (except
        `under`'s own manifest.json)."""
        base = self.root / under if under else self.root
        out = {}
        for p in sorted(base.rglob("*")):
            rel = str(p.relative_to(base))
            if p.is_file() and rel != "manifest.json":
                out[rel] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        return out

    def write_manifest(self, manifest: dict[str, Any], under: str = "") -> str:
        """manifest.json for the package (or a sub-package folder), listing every file below it
        (written so far: files written later pin this manifest instead). Returns its sha256."""
        doc = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, **manifest, "files": self.files(under)}
        text = json.dumps(doc, indent=1) + "\n"
        self.write_text(f"{under}/manifest.json" if under else "manifest.json", text)
        return hashlib.sha256(text.encode()).hexdigest()

    def finish(self) -> Path:
        """Move the finished package into place (its manifest.json is written)."""
        if not (self.root / "manifest.json").is_file():
            raise InternalError("the package's manifest.json was not written")
        old = self.dest.parent / f".{self.dest.name}.old-{os.getpid()}"
        if self.dest.exists():
            self.dest.rename(old)
        self.root.rename(self.dest)
        shutil.rmtree(old, ignore_errors=True)
        return self.dest

    def abort(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "PackageWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
