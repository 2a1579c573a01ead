"""Progress of long work: plain lines at each quarter and at the end when stdout is not a terminal,
live rich bars on a terminal (checked through a pseudo-terminal), nothing for library callers."""
from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest

from packager import progress
from support.helpers import REPO


def test_plain_lines_at_each_quarter_and_when_done():
    lines = []
    with progress.reporting(lines.append, live=False):
        with progress.task("schedule x86-64", 8, "kernels") as bar:
            for _ in range(8):
                bar.advance()
    assert [ln.split(" (")[0] for ln in lines] == ["  schedule x86-64: 2/8 kernels", "  schedule x86-64: 4/8 kernels",
                                                    "  schedule x86-64: 6/8 kernels",
                                                    "  schedule x86-64: 8/8 kernels done"]


def test_library_callers_see_nothing(capsys):
    with progress.task("layout candidates", 3, "convs") as bar:
        bar.advance(3)
    assert bar.done == 3 and capsys.readouterr().out == ""


def _pack_build_on_a_terminal(spec) -> str:
    """`pack build` with its stdout on a pseudo-terminal; returns what the terminal got."""
    leader, follower = pty.openpty()
    env = dict(os.environ, COLUMNS="120", TERM="xterm")
    proc = subprocess.Popen([sys.executable, "-m", "packager.cli", "build", str(spec)], stdout=follower,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, cwd=REPO)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:                    # the follower side closed: the process is done
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=900) == 0, proc.stderr.read().decode()[-3000:]
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_build_shows_live_bars_on_a_terminal_and_lines_in_a_pipe(sample_root, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text((sample_root / "cnn" / "spec.yaml").read_text().replace("model: model.onnx",
                                                                          f"model: {sample_root / 'cnn' / 'model.onnx'}")
                    + f"output: {tmp_path / 'pkg'}\n")
    shown = _pack_build_on_a_terminal(spec)
    assert "━" in shown and "layout candidates" in shown and "kernels" in shown, shown[-3000:]
    piped = subprocess.run([sys.executable, "-m", "packager.cli", "build", str(spec)], capture_output=True, text=True,
                           cwd=REPO)
    assert piped.returncode == 0, piped.stderr
    assert "━" not in piped.stdout and "\x1b[" not in piped.stdout
    assert any(ln.startswith("  schedule x86-64") and "kernels done" in ln for ln in piped.stdout.splitlines()), \
        piped.stdout
