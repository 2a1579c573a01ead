"""Writing a package folder atomically (the manifest's contents come from manifest.py).

Everything is written into a temporary sibling folder; only a complete package replaces the
destination, so a failed build leaves no partial output behind (and keeps any older package).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import InternalError, UserError, write_failure
from ..frontend.sizes import human_size
from ..supervise import record
from .manifest import BENCH_RESULTS, MANIFEST_FORMAT, MANIFEST_VERSION, WRAPPER_MODEL, sha256_file


HINT = "free space there or choose another --output"
# the packager's own files its manifest cannot list: a rebuild replaces them (stale bench results included)
WRITTEN_AFTER_MANIFEST = {WRAPPER_MODEL, "report.html", BENCH_RESULTS}


def check_destination(dest: Path) -> None:
    """Fail before anything is compiled if `dest` cannot receive a package: it is something else
    than a package, or its folder is on a read-only file system or not writable."""
    if dest.exists() and not (dest / "manifest.json").is_file():
        raise UserError(f"output folder {dest} exists and is not a package; remove it or choose another --output")
    if dest.is_dir():
        _check_only_package_files(dest)
    folder = dest.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise UserError(f"cannot write the package to {dest}: {folder} is a file, not a folder; "
                        "choose another --output")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise write_failure(e, folder, f"package to {dest}", HINT) or e from None


COMPILE_BYTES = 64 << 20           # a build's compiler output in the temporary folder, at most about


def check_space(dest: Path, package_bytes: int) -> None:
    """Fail before anything is compiled when the package's file system or the temporary folder's
    (kernels are compiled there) has less free space than the build will write: on a failed
    write LLVM ends the process with its own message. `package_bytes`: what the package will
    hold, about (its weights per target)."""
    folder = dest.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    temp = Path(tempfile.gettempdir())
    needs = [(folder, package_bytes + (16 << 20), f"the package {dest}", HINT),
             (temp, COMPILE_BYTES, "compiling kernels", "free space there or set TMPDIR to another folder")]
    if _device(folder) == _device(temp):
        needs = [(folder, needs[0][1] + COMPILE_BYTES, f"the package {dest} and compiling its kernels", HINT)]
    for where, need, what, hint in needs:
        free = shutil.disk_usage(where).free
        if free < need:
            raise UserError(f"not enough free space for {what}: {where} has {human_size(free)} free, the build "
                            f"needs about {human_size(need)}; {hint}")


def _device(path: Path) -> int | None:
    try:
        return os.stat(path).st_dev
    except OSError:
        return None


def _check_only_package_files(dest: Path) -> None:
    """Refuse to replace a package folder that holds files its manifest does not list (the user's own:
    replacing the folder would delete them)."""
    try:
        listed = set(json.loads((dest / "manifest.json").read_text()).get("files", {}))
    except (OSError, ValueError, AttributeError):
        raise UserError(f"output folder {dest} holds a manifest.json that is not a package's; remove it or choose "
                        "another --output") from None
    for p in sorted(dest.rglob("*")):
        rel = p.relative_to(dest).as_posix()
        if (p.is_file() or p.is_symlink()) and rel not in listed and p.name != "manifest.json" \
                and rel not in WRITTEN_AFTER_MANIFEST:
            raise UserError(f"output folder {dest} holds {rel}, which is not part of the package there; "
                            "move it away (a rebuild replaces the whole folder) or choose another --output")


class PackageWriter:
    """Stage files under a temporary folder, then move the finished package into place. Used as a
    context manager: on any failure the staged files (and the parent folders it made) are removed,
    an older package at the destination is kept, and a full or read-only disk is a UserError."""

    def __init__(self, dest: Path):
        check_destination(dest)
        self.dest = dest
        self.root = dest.parent / f".{dest.name}.partial-{os.getpid()}"
        self.made: list[Path] = []                 # parent folders this writer created, innermost first
        with self._writing():
            for folder in reversed(dest.parents):
                if not folder.exists():
                    try:
                        folder.mkdir()
                    except FileExistsError:        # made by a parallel build meanwhile
                        continue
                    record("made", folder)
                    self.made.insert(0, folder)
            shutil.rmtree(self.root, ignore_errors=True)
            record("staged", self.root)
            self.root.mkdir()

    @contextmanager
    def _writing(self):
        """Turn the disk refusing a write into the UserError that names the package; clean up."""
        try:
            yield
        except BaseException as e:
            error = write_failure(e, self.dest.parent, f"package to {self.dest}", HINT)
            self.abort()
            if error is not None:
                raise error from e
            raise

    def path(self, rel: str) -> Path:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def write_json(self, rel: str, obj: Any) -> Path:
        return self.write_text(rel, json.dumps(obj, indent=1, sort_keys=False) + "\n")

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
        """Move the finished package (its manifest.json written) into place; if that fails, an
        older package at the destination is put back."""
        if not (self.root / "manifest.json").is_file():
            raise InternalError("the package's manifest.json was not written")
        with self._writing():
            old = self.dest.parent / f".{self.dest.name}.old-{os.getpid()}"
            replaced = self.dest.exists()
            if replaced:
                record("moved", old, self.dest)
                self.dest.rename(old)
            try:
                self.root.rename(self.dest)
            except BaseException:
                if replaced:
                    old.rename(self.dest)
                raise
        self.made = []
        shutil.rmtree(old, ignore_errors=True)
        return self.dest

    def abort(self) -> None:
        """Remove the staged files and the parent folders this writer made (if still empty)."""
        shutil.rmtree(self.root, ignore_errors=True)
        for folder in self.made:
            try:
                folder.rmdir()
            except OSError:
                break
        self.made = []

    def __enter__(self) -> "PackageWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Whatever failed inside the `with` (a compiler, onnx.save, TVM writing into the staged
        folder): clean up, and report a full or read-only disk as the UserError it is."""
        if exc is not None:
            with self._writing():
                raise exc
