"""Re-signing a package a test changed on purpose: the manifest's sha256/bytes of the changed files,
and the wrapper model's pins (package_sha256 of each PackagedModel node) on the new manifest, so
what is tested is the changed content, not the checksum or pin check."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import onnx

WRAPPER = "ort/model.onnx"


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def repin(pkg: Path) -> None:
    """Points every PackagedModel node of pkg's wrapper at the current manifest it opens."""
    wrapper = pkg / WRAPPER
    if not wrapper.is_file():
        return
    model = onnx.load(str(wrapper))
    for node in model.graph.node:
        if node.domain != "ai.packager":
            continue
        for a in node.attribute:
            if a.name == "package":
                manifest = (wrapper.parent / a.s.decode() / "manifest.json").resolve()
        for a in node.attribute:
            if a.name == "package_sha256":
                a.s = _sha256(manifest).encode()
    onnx.save(model, str(wrapper))


def resign(pkg: Path, *rels: str) -> None:
    """Records the current sha256 and size of files `rels` in pkg's manifest and re-pins the wrapper."""
    mpath = pkg / "manifest.json"
    m = json.loads(mpath.read_text())
    for rel in rels:
        p = pkg / rel
        m["files"][rel] = {"sha256": _sha256(p), "bytes": p.stat().st_size}
    mpath.write_text(json.dumps(m, indent=1))
    repin(pkg)
