"""A build whose output cannot be written (a full disk, a read-only output folder) fails with one
UserError line and leaves nothing behind: no destination, no `.NAME.partial-*` / `.NAME.old-*`
sibling, no parent folder it made, no partial cache entry; an older package at the destination
stays as it was.

The full disk is real: a 1 MiB tmpfs (mounting needs root or CAP_SYS_ADMIN; the tests skip with
the reason where that is not allowed). The read-only folder is the same tmpfs remounted `ro`,
since chmod does not stop root."""
from __future__ import annotations

import errno
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from support.helpers import REPO, assert_clean_error, run_pack, write_spec
from packager.codegen.tools import run_tool
from packager.emit.package import PackageWriter, check_destination
from packager.errors import InternalError, UserError

BIG = 2 << 20                      # twice the tmpfs


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@contextmanager
def tmpfs(path: Path, size: str = "1m"):
    """A small real file system at `path`, unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no `mount` command: cannot simulate a full or read-only disk with a tmpfs")
    r = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    if r.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here (needs root or CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def disk(tmp_path):
    """A 1 MiB file system."""
    with tmpfs(tmp_path / "disk") as d:
        yield d


def make_package(dest: Path, files: dict[str, bytes]) -> Path:
    with PackageWriter(dest) as w:
        for rel, data in files.items():
            w.path(rel).write_bytes(data)
        w.write_manifest({"name": dest.name})
        return w.finish()


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def fill(folder: Path) -> Path:
    """Take every free byte of `folder`'s file system (the returned file holds them)."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as fh:         # unbuffered: close() has nothing left to write
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


def assert_write_error(e: pytest.ExceptionInfo, dest: Path, why: str) -> None:
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg, msg
    assert f"cannot write package to {dest}" in msg and why in msg, msg


# Ways the build writes into the staging folder: the writer's own methods, a path it hands out
# (onnx.save, TVM's write_to_file), a copy, and an external tool (the compiler and linker).
def _write_text(w: PackageWriter, tmp: Path) -> None:
    w.write_text("README.md", "x" * BIG)


def _path(w: PackageWriter, tmp: Path) -> None:
    w.path("ort/model.onnx").write_bytes(b"\0" * BIG)


def _copy(w: PackageWriter, tmp: Path) -> None:
    (tmp / "big.bin").write_bytes(b"\1" * BIG)
    w.copy(tmp / "big.bin", "runtime/big.bin")


def _copytree(w: PackageWriter, tmp: Path) -> None:
    for k in range(4):
        (tmp / "tree" / f"f{k}.bin").parent.mkdir(exist_ok=True)
        (tmp / "tree" / f"f{k}.bin").write_bytes(b"\2" * (BIG // 4))
    w.copytree(tmp / "tree", "runtime/src")


def _tool(w: PackageWriter, tmp: Path) -> None:
    out = w.path("targets/x86-64/kernels.so")
    run_tool(["sh", "-c", f"head -c {BIG} /dev/zero > '{out}'"], "linking kernels for 'x86-64'")


WRITES = [_write_text, _path, _copy, _copytree, _tool]


@pytest.mark.parametrize("write", WRITES, ids=lambda f: f.__name__[1:])
@pytest.mark.parametrize("previous", [False, True], ids=["new", "replacing"])
def test_full_disk_leaves_nothing_behind(disk, tmp_path, write, previous):
    dest = disk / "pkg"
    if previous:
        make_package(dest, {"plan.json": b"{}", "weights.bin": b"\7" * 1000})
    before = snapshot(dest) if previous else None
    with pytest.raises(UserError) as e:
        with PackageWriter(dest) as w:
            w.write_json("plan.json", {"small": True})
            write(w, tmp_path)
    assert_write_error(e, dest, "No space left on device")
    assert sorted(p.name for p in disk.iterdir()) == (["pkg"] if previous else [])
    if previous:
        assert snapshot(dest) == before


@pytest.mark.parametrize("previous", [False, True], ids=["new", "replacing"])
def test_disk_full_when_the_manifest_is_written(disk, previous):
    """The last write before the move (manifest.json) fails: still nothing half-written."""
    dest = disk / "pkg"
    if previous:
        make_package(dest, {"plan.json": b"{}"})
    before = snapshot(dest) if previous else None
    with pytest.raises(UserError) as e:
        with PackageWriter(dest) as w:
            w.write_json("plan.json", {"new": True})
            filler = fill(disk)
            w.write_manifest({"name": "pkg"})
            w.finish()
    assert_write_error(e, dest, "No space left on device")
    filler.unlink()
    assert sorted(p.name for p in disk.iterdir()) == (["pkg"] if previous else [])
    if previous:
        assert snapshot(dest) == before


def test_a_failed_swap_puts_the_previous_package_back(tmp_path, monkeypatch):
    """finish() moves the old package aside, then the new one in; if the second rename fails the
    old one returns (it used to stay at .pkg.old-PID with no package at the destination)."""
    dest = tmp_path / "pkg"
    make_package(dest, {"plan.json": b"old"})
    before = snapshot(dest)
    real_rename = Path.rename

    def rename(self, target):
        if ".partial-" in self.name:
            raise OSError(errno.EIO, "Input/output error", str(self))
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OSError, match="Input/output error"):
        with PackageWriter(dest) as w:
            w.write_json("plan.json", {"new": True})
            w.write_manifest({"name": "pkg"})
            w.finish()
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"] and snapshot(dest) == before


def test_folders_made_for_a_failed_build_are_removed(tmp_path):
    dest = tmp_path / "out" / "deep" / "pkg"
    with pytest.raises(InternalError):
        with PackageWriter(dest) as w:
            w.write_text("README.md", "x")
            raise InternalError("code generation failed")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def read_only(tmp_path):
    """A read-only file system holding an older package at `pkg`."""
    with tmpfs(tmp_path / "ro") as d:
        make_package(d / "pkg", {"plan.json": b"{}"})
        r = _mount("-o", "remount,ro", str(d))
        if r.returncode != 0:
            pytest.skip(f"remounting the tmpfs read-only is not permitted here: {r.stderr.strip()}")
        yield d


@pytest.mark.parametrize("name", ["pkg", "new", "a/b/new"])
def test_read_only_output_folder(read_only, name):
    before = snapshot(read_only)
    for attempt in (check_destination, PackageWriter):
        with pytest.raises(UserError) as e:
            attempt(read_only / name)
        assert "Read-only file system" in str(e.value) and "\n" not in str(e.value), str(e.value)
        assert f"cannot write package to {read_only / name}" in str(e.value)
    assert snapshot(read_only) == before and [p.name for p in read_only.iterdir()] == ["pkg"]


def _tiny_model(path: Path) -> Path:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_pack_build_into_a_read_only_folder_stops_before_compiling(read_only, tmp_path):
    """The CLI: exit 2, one line, and before any compilation (check_inputs probes the folder)."""
    _tiny_model(tmp_path / "model.onnx")
    spec = write_spec(tmp_path, "name: tiny\nmodel: model.onnx\ntargets: [x86-64]\n")
    r = run_pack("build", spec, "-o", read_only / "pkg2", cwd=REPO)
    assert_clean_error(r, 2, f"cannot write package to {read_only / 'pkg2'}", "Read-only file system")
    assert "import + graph passes" not in r.stdout, r.stdout
    assert [p.name for p in read_only.iterdir()] == ["pkg"]


def test_full_cache_disk_leaves_no_partial_entry(disk, monkeypatch):
    """Staging the runtime sources (~2 MB) into a full cache: a UserError naming the cache, and
    no half-copied src-*.tmp or src-* folder that a later build could take for complete."""
    from packager.emit.runtime import staged_sources

    monkeypatch.setenv("PACKAGER_CACHE_DIR", str(disk))
    monkeypatch.setenv("PACKAGER_ORT_INCLUDE", str(disk / "no-ort-headers"))    # no download attempt
    with pytest.raises(UserError) as e:
        staged_sources()
    msg = str(e.value)
    assert f"cannot write to the packager cache {disk}: No space left on device" in msg and "\n" not in msg, msg
    assert "PACKAGER_CACHE_DIR" in msg
    assert [p.name for p in (disk / "runtime").iterdir() if not p.name.endswith(".lock")] == []


def test_full_disk_under_the_tuning_database(disk):
    from packager.optimize.schedule.measure.database import TuningDatabase

    db = TuningDatabase(disk / "tuning")
    db.put("kernel", {"schedule": "x" * BIG}, "gensor-cpu", "test")
    with pytest.raises(UserError, match=f"cannot write to {disk / 'tuning'}: No space left on device"):
        db.save()
    assert [p.name for p in (disk / "tuning").iterdir()] == [".lock"]


@pytest.mark.slow
def test_pack_build_onto_a_full_disk(disk, tmp_path):
    """The whole `pack build` of the mlp sample (x86-64 only) into a 1 MiB file system that holds
    an older package: exit 2, one line before anything is compiled, the older package untouched."""
    from make_samples import write_samples

    write_samples(["mlp"], root=tmp_path)
    text = (REPO / "samples" / "mlp" / "spec.yaml").read_text()
    assert "targets: [x86-64, arm64]" in text
    spec = write_spec(tmp_path / "mlp", text.replace("targets: [x86-64, arm64]", "targets: [x86-64]"))
    make_package(disk / "mlp", {"plan.json": b"old"})
    before = snapshot(disk)
    r = run_pack("build", spec, "-o", disk / "mlp", cwd=REPO)
    assert_clean_error(r, 2, f"not enough free space for the package {disk / 'mlp'}: {disk} has", "free space there")
    assert "import + graph passes" not in r.stdout and "LLVM" not in r.stderr, r.stdout + r.stderr
    assert snapshot(disk) == before and [p.name for p in disk.iterdir()] == ["mlp"]


def test_a_full_temporary_folder_stops_the_build_before_compiling(disk, tmp_path):
    """Kernels are compiled under TMPDIR: when it is full, LLVM would end the process with its
    own 'IO failure' line; the build refuses first, with one line."""
    _tiny_model(tmp_path / "model.onnx")
    spec = write_spec(tmp_path, "name: tiny\nmodel: model.onnx\ntargets: [x86-64]\n")
    r = run_pack("build", spec, "-o", tmp_path / "out" / "tiny", cwd=REPO, env={"TMPDIR": str(disk)})
    assert_clean_error(r, 2, "not enough free space for compiling kernels", "set TMPDIR to another folder")
    assert "import + graph passes" not in r.stdout and not (tmp_path / "out").exists()
    assert list(disk.iterdir()) == []
