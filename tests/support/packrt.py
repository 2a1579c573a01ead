"""packrt-run as the runtime tests call it: the command for a package's binary (x86_64 natively,
aarch64 under qemu), running it, and the one-line error every failure must be."""
from __future__ import annotations

import subprocess
from pathlib import Path

X86 = "x86_64"


def cli(pkg: Path, arch: str = X86) -> list[str]:
    exe = str(pkg / "runtime" / arch / "bin" / "packrt-run")
    return [exe] if arch == X86 else ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", exe]


def run(cmd, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)


def one_line_error(r, code, *needles):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("packrt-run: error:"), r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)
