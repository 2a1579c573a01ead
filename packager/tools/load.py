"""Load beside a benchmark: a deployment machine is rarely quiet. `twin` runs a second process of
the same model beside each runtime while it is timed (ours beside ours, onnxruntime beside
onnxruntime: a service with two workers); `busy:N` runs N busy loops beside both (other jobs on
the machine); `build:SPEC` runs `pack build SPEC` over and over, each into an empty tuning
database, for the whole benchmark (a build machine that also serves). Twins and loops start
before a timed round and stop after it, so the rounds of the runtimes still alternate as in a
quiet `pack bench`."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import InternalError, UserError

TWIN_START_S = 60.0        # an onnxruntime twin loads its model before it says it is running
SETTLE_S = 0.3             # a started load runs this long before the round starts
BUILD_START_S = 10.0       # a looping pack build runs this long before the benchmark starts

# An onnxruntime session running the model (or the wrapper model) until killed; "ready" after its
# first runs, so the timed round starts once the twin is at full speed.
_ORT_TWIN = """
import sys, numpy as np
from packager.frontend.ort_run import ort_session
model, threads, feeds, library = sys.argv[1], int(sys.argv[2]), dict(np.load(sys.argv[3])), sys.argv[4] or None
s = ort_session(model, threads, library)
for _ in range(3):
    s.run(None, feeds)
print("ready", flush=True)
while True:
    s.run(None, feeds)
"""


@dataclass(frozen=True)
class Load:
    """What runs beside the measurement: nothing, a twin of the timed runtime, or N busy loops."""

    kind: str = "none"     # none | twin | busy | build
    loops: int = 0
    spec: Path | None = None

    @staticmethod
    def parse(text: str) -> "Load":
        if text in ("none", "twin"):
            return Load(text)
        if text.startswith("busy:") and text[5:].isdigit() and 0 < int(text[5:]) <= 256:
            return Load("busy", int(text[5:]))
        if text.startswith("build:"):
            spec = Path(text[6:])
            if not spec.is_file():
                raise UserError(f"--load {text}: no spec file {spec}")
            return Load("build", spec=spec)
        raise UserError(f"--load {text}: expected none, twin, busy:N (N busy loops, 1 to 256) or build:SPEC")

    @property
    def label(self) -> str:
        return {"busy": f"busy:{self.loops}", "build": f"build:{self.spec}"}.get(self.kind, self.kind)

    def describe(self, threads: int) -> str:
        if self.kind == "twin":
            return f"beside a twin process of the same runtime and model ({threads} thread(s))"
        if self.kind == "busy":
            return f"beside {self.loops} busy loop(s)"
        if self.kind == "build":
            return f"beside pack build {self.spec} (over and over)"
        return "quiet"

    @contextmanager
    def throughout(self) -> Iterator[None]:
        """The load that runs for the whole benchmark: `pack build SPEC` in a loop."""
        if self.kind != "build":
            yield
            return
        with tempfile.TemporaryDirectory(prefix="pack-bench-load-") as tmp:
            spec = _with_database(self.spec, Path(tmp))
            script = 'while true; do rm -rf "$1/db" "$1/pkg"; "$2" -m packager.cli build "$3" --output "$1/pkg"; done'
            p = subprocess.Popen(["sh", "-c", script, "sh", tmp, sys.executable, str(spec)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                time.sleep(BUILD_START_S)       # past the imports, into the passes
                yield
            finally:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    @contextmanager
    def beside(self, twin: list[str] | None) -> Iterator[None]:
        """Runs the load while the block times one runtime; `twin` is that runtime's twin command
        (a packrt-run, or python running ort_twin_command's script)."""
        if self.kind in ("none", "build"):
            yield
            return
        procs: list[subprocess.Popen] = []
        try:
            if self.kind == "busy":
                procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.loops)]
            elif twin is not None:
                procs = [_start_twin(twin)]
            time.sleep(SETTLE_S)
            for p in procs:
                if p.poll() is not None:
                    raise InternalError(f"the load beside the benchmark stopped (exit {p.returncode}): {p.args}")
            yield
        finally:
            for p in procs:
                p.kill()
                p.wait()


def _with_database(spec: Path, tmp: Path) -> Path:
    """A copy of `spec` in `tmp` whose model path is absolute and whose tuning database is
    `tmp/db`: every build of the loop searches and times its candidates again."""
    import yaml

    raw = yaml.safe_load(spec.read_text())
    raw["model"] = str((spec.parent / raw["model"]).resolve())
    raw.pop("output", None)
    raw.setdefault("optimize", {}).setdefault("tuning", {})["database"] = str(tmp / "db")
    out = tmp / "spec.yaml"
    out.write_text(yaml.safe_dump(raw))
    return out


def _start_twin(cmd: list[str]) -> subprocess.Popen:
    """Starts a twin; an onnxruntime twin is waited for until it prints "ready"."""
    ort = cmd[:2] == [sys.executable, "-c"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE if ort else subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         text=True)
    if ort and p.stdout is not None:
        started = select.select([p.stdout], [], [], TWIN_START_S)[0]
        if not started or p.stdout.readline().strip() != "ready":
            p.kill()
            p.wait()
            raise InternalError(f"the onnxruntime twin did not start: {' '.join(map(str, cmd[3:5]))}")
    return p


def ort_twin_command(model: Path, threads: int, feeds: Path, library: Path | None = None) -> list[str]:
    """An onnxruntime session of `model` running `feeds` (an .npz) until killed."""
    return [sys.executable, "-c", _ORT_TWIN, str(model), str(threads), str(feeds), str(library or "")]


def packrt_twin_command(cli: list[str], pkg: Path, target: str, inputs: list[str], threads: int) -> list[str]:
    """packrt-run running the package's target on the benchmark's inputs until killed."""
    return [*cli, str(pkg), "--target", target, *inputs, "--threads", str(threads), "--warmup", "0",
            "--iters", str(2**31 - 1)]
