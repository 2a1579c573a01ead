"""manifest.json (emit/manifest.py and the writer's write_manifest): every file listed with size
and sha256, and the reader that finds a package whose files changed."""
from __future__ import annotations

import json

import pytest

from packager.emit.manifest import MANIFEST_FORMAT, open_package, output_file
from packager.emit.package import PackageWriter
from packager.errors import UserError


@pytest.fixture
def package(tmp_path):
    with PackageWriter(tmp_path / "pkg") as w:
        w.write_text("targets/x/plan.json", "{}")
        w.write_text("parts/p0/targets/x/plan.json", "[]")
        part_sha = w.write_manifest({"name": "m.p0"}, under="parts/p0")
        w.write_manifest({"name": "m", "targets": [{"name": "x"}]})
        root = w.finish()
    return root, part_sha


def test_every_file_is_listed_and_the_part_has_its_own(package):
    import hashlib

    root, part_sha = package
    top = json.loads((root / "manifest.json").read_text())
    assert top["format"] == MANIFEST_FORMAT and "targets/x/plan.json" in top["files"]
    assert "parts/p0/manifest.json" in top["files"]                   # the part's manifest is a file of the root's
    part = json.loads((root / "parts/p0/manifest.json").read_text())
    assert list(part["files"]) == ["targets/x/plan.json"]             # paths relative to the part
    assert hashlib.sha256((root / "parts/p0/manifest.json").read_bytes()).hexdigest() == part_sha


def test_the_reader_finds_changed_and_missing_files(package):
    root, _ = package
    pkg = open_package(root)
    assert pkg.check_files() == [] and pkg.target("x") == {"name": "x"}
    (root / "targets/x/plan.json").write_text("{ }")
    assert pkg.check_files() == ["targets/x/plan.json: 3 bytes, manifest says 2"]
    (root / "targets/x/plan.json").write_text("[]")
    assert pkg.check_files() == ["targets/x/plan.json: sha256 mismatch"]
    (root / "targets/x/plan.json").unlink()
    assert pkg.check_files() == ["targets/x/plan.json: missing"]
    with pytest.raises(UserError, match="no target 'y' \\(targets: x\\)"):
        pkg.target("y")


def test_what_is_not_a_package_is_said_in_one_line(tmp_path):
    with pytest.raises(UserError, match="not a package \\(no manifest.json\\)"):
        open_package(tmp_path)
    (tmp_path / "manifest.json").write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        open_package(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format": "other", "version": 1}')
    with pytest.raises(UserError, match="not a version-1 packager manifest"):
        open_package(tmp_path)


def test_output_files_are_named_as_packrt_run_names_them():
    assert output_file("logits") == "logits.npy"
    assert output_file("gpu_0/softmax:0") == "gpu_0_softmax_0.npy" and output_file("") == "output.npy"
