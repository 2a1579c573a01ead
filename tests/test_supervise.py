"""`pack build` under supervision (packager/supervise.py): Ctrl-C and SIGTERM stop a build that is
busy in compiled code, also when the shell started it with SIGINT ignored, and no way the build
process can end (a signal, LLVM's exit(1), a kill) leaves a staged package folder or a temporary
file behind; a package the build had moved aside is put back."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from packager import supervise
from packager.emit.package import PackageWriter
from support.helpers import REPO


def _child(work) -> tuple[int, list[str]]:
    said: list[str] = []
    return supervise.supervised(work, said.append), said


def test_a_child_that_ends_abruptly_leaves_nothing_and_is_one_line(tmp_path):
    dest = tmp_path / "out" / "pkg"

    def work() -> int:
        w = PackageWriter(dest)
        w.write_text("targets/x/kernels.so", "half written")
        os._exit(1)                                # what LLVM's report_fatal_error does

    code, said = _child(work)
    assert code == 1 and said == ["internal error: the build process ended abruptly (exit status 1); "
                                  "nothing was written"]
    assert not (tmp_path / "out").exists()          # the staged folder and the parent it made


def test_an_abrupt_end_on_a_full_disk_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setattr(supervise, "_low_space", lambda folder: folder == tmp_path)

    def work() -> int:
        PackageWriter(tmp_path / "pkg")
        os.kill(os.getpid(), signal.SIGKILL)

    code, said = _child(work)
    assert code == 2 and "ended abruptly (signal SIGKILL) with no space left on" in said[0]
    assert list(tmp_path.iterdir()) == []


def test_a_package_moved_aside_is_put_back(tmp_path):
    dest = tmp_path / "pkg"
    dest.mkdir()
    (dest / "manifest.json").write_text("{}")

    def work() -> int:
        old = tmp_path / ".pkg.old-1"
        supervise.record("moved", old, dest)
        dest.rename(old)
        os._exit(3)

    code, _ = _child(work)
    assert code == 1 and (dest / "manifest.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]


def test_an_error_the_child_reported_keeps_its_exit_code(tmp_path):
    code, said = _child(lambda: 2)
    assert code == 2 and said == []


def test_temporary_files_go_under_the_supervisor_and_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(supervise.tempfile, "tempdir", str(tmp_path))

    def work() -> int:
        import tempfile
        Path(tempfile.mkdtemp(prefix="packager-shapes-"), "x").write_text("left")
        return 0 if os.environ["TMPDIR"].startswith(str(tmp_path)) else 5

    assert _child(work) == (0, [])
    assert list(tmp_path.iterdir()) == []


def _staged_build(sample_root: Path, tmp_path: Path, ignore_sigint: bool = False):
    """`pack build` of the cnn sample, returned once its staged package folder exists."""
    spec = yaml.safe_load((sample_root / "cnn" / "spec.yaml").read_text())
    spec.update(model=str(sample_root / "cnn" / "model.onnx"), output=str(tmp_path / "dist" / "cnn"),
                targets=["x86-64"])
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "packager.cli", "build", str(tmp_path / "spec.yaml")],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None)
    deadline = time.monotonic() + 300
    while not list((tmp_path / "dist").glob(".cnn.partial-*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc, tmp


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, ignored", [(signal.SIGINT, 130, True), (signal.SIGTERM, 143, False)])
def test_a_signal_stops_a_build_and_leaves_nothing(sample_root, tmp_path, sig, code, ignored):
    proc, tmp = _staged_build(sample_root, tmp_path, ignore_sigint=ignored)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert err.strip().splitlines()[-1] == "interrupted: the build was stopped; nothing was written"
    assert not (tmp_path / "dist").exists() and list(tmp.iterdir()) == []     # dist/ was made by the build
