"""Re-signing a damaged copy, running packrt-run on it and classifying the outcome into a table."""
from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import signal
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from support.resign import repin

from . import ort as ort_engine
from .process import spawn
from .mutations import Case, host_target
from ..sanitized import SANITIZER_ENV
from .variants import variants

# --------------------------------------------------------------------------------------------
# Re-signing
# --------------------------------------------------------------------------------------------

def _stat_key(p: Path):
    try:
        st = os.lstat(p)
    except OSError:
        return None
    return st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino


def _entry_path(pkg: Path, rel: str) -> Path:
    return Path(rel) if os.path.isabs(rel) else pkg / rel


def snapshot(pkg: Path) -> dict:
    """lstat of every file the manifest lists (to see later which ones a mutation changed)."""
    m = json.loads((pkg / "manifest.json").read_text())
    return {rel: _stat_key(_entry_path(pkg, rel)) for rel in m["files"]}


def signature(p: Path) -> tuple[str, int] | None:
    """(sha256, bytes) of what the runtime would read at `p` (through symlinks); FIFOs and other
    special files are never opened (they would block): empty content, their stat size."""
    try:
        st = os.stat(p)
    except OSError:
        return None
    if stat.S_ISREG(st.st_mode):
        data = p.read_bytes()
        return hashlib.sha256(data).hexdigest(), len(data)
    return hashlib.sha256(b"").hexdigest(), st.st_size


def resign(pkg: Path, before: dict) -> None:
    """Recomputes sha256 and bytes of every manifest entry whose file changed since `before` (or
    that is new), so the package passes its checksum check. A manifest that is no longer a JSON
    object with a `files` object is left alone."""
    mpath = pkg / "manifest.json"
    try:
        m = json.loads(mpath.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(m, dict) or not isinstance(m.get("files"), dict):
        return
    changed = False
    for rel, entry in m["files"].items():
        if not isinstance(entry, dict):
            continue
        p = _entry_path(pkg, rel)
        if rel in before and _stat_key(p) == before[rel]:
            continue
        sig = signature(p)
        if sig is None:
            continue
        entry["sha256"], entry["bytes"] = sig
        changed = True
    if changed:
        mpath.write_text(json.dumps(m, indent=1))


# --------------------------------------------------------------------------------------------
# Running and classifying
# --------------------------------------------------------------------------------------------

OUTCOMES = ("clean", "correct", "wrong", "crash", "hang", "sanitizer", "messy")
SANITIZER_MARKERS = ("AddressSanitizer", "UndefinedBehaviorSanitizer", "runtime error:")
# With allocator_may_return_null=1 ASan still prints this when an allocation fails (and returns
# NULL, as glibc would): the allocation failing is no report; what the runtime then says is judged.
ALLOCATION_WARNING = re.compile(r"^==\d+==WARNING: AddressSanitizer failed to allocate 0x[0-9a-f]+ bytes\n?", re.MULTILINE)
NATIVE_ADDRESS_SPACE = 2 << 30   # RLIMIT_AS for `native` variants: thread stacks run out, not the machine's pids


@dataclass
class Row:
    name: str
    cls: str
    outcome: str
    exit: str          # the exit code, a signal name, or "timeout"
    message: str       # stderr's first line (for sanitizer reports, the report's line)
    seconds: float
    stderr: str = field(default="", repr=False)


def classify(returncode: int | None, stderr: str, outputs_equal: Callable[[], bool],
             prefix: str = "packrt-run: error:") -> str:
    if returncode is None:
        return "hang"
    if any(m in stderr for m in SANITIZER_MARKERS):
        return "sanitizer"
    if returncode < 0:
        return "crash"
    if returncode == 0:
        return "correct" if outputs_equal() else "wrong"
    lines = stderr.strip().splitlines()
    if returncode in (1, 2) and len(lines) == 1 and lines[0].startswith(prefix):
        return "clean"
    return "messy"


def first_line(stderr: str, outcome: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if outcome == "sanitizer":
        for ln in lines:
            if "ERROR: AddressSanitizer" in ln or "runtime error:" in ln or "UndefinedBehaviorSanitizer:" in ln:
                return ln
    return lines[0] if lines else ""


def load_outputs(out_dir: Path) -> dict[str, np.ndarray]:
    """Every NAME.npy in out_dir (memory-mapped first: a header with a huge shape fails, it does
    not allocate)."""
    return {p.name: np.array(np.load(p, mmap_mode="r", allow_pickle=False)) for p in sorted(out_dir.glob("*.npy"))}


def outputs_equal(out_dir: Path, reference: dict[str, np.ndarray]) -> bool:
    for name, want in reference.items():
        try:
            got = np.array(np.load(out_dir / name, mmap_mode="r", allow_pickle=False))
        except (OSError, ValueError, EOFError):
            return False
        if got.dtype != want.dtype or got.shape != want.shape or \
                not np.allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True):
            return False
    return True


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_STACK, (8 << 20, 8 << 20))
    resource.setrlimit(resource.RLIMIT_AS, (NATIVE_ADDRESS_SPACE, NATIVE_ADDRESS_SPACE))


def execute(exe: Path, case: Case, out_dir: Path, timeout: float, native: bool = False):
    """Runs packrt-run on the case; (returncode or None on timeout, stderr, seconds)."""
    cmd = [str(exe), str(case.package_arg or case.pkg)]
    for name, path in case.inputs.items():
        cmd += ["--input", f"{name}={path}"]
    cmd += ["--output-dir", str(out_dir), "--iters", "1", "--warmup", "0", f"--threads={case.threads}"]
    return spawn(cmd, timeout, {**os.environ, **SANITIZER_ENV}, _limits if native else None)


def _exit_text(rc: int | None, timeout: float) -> str:
    if rc is None:
        return f"timeout {timeout:g} s"
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return str(rc)


def copy_package(base: Path, dst: Path) -> None:
    """The package without runtime/ and ort/ (packrt-run reads neither; the binary is run from
    the base package or the sanitized build)."""
    shutil.copytree(base, dst, symlinks=True,
                    ignore=lambda d, names: [n for n in names if Path(d) == base and n in ("runtime", "ort")])


def default_inputs(package: Path, work: Path) -> dict[str, Path]:
    """Random inputs (seed 7, like tests/conftest.py's cnn_input) for the first profile."""
    m = json.loads((package / "manifest.json").read_text())
    plan = json.loads((package / host_target(m)["plan"]).read_text())
    pr = plan["profiles"][0]
    rng = np.random.default_rng(7)
    out = {}
    for io in pr["inputs"]:
        t = pr["tensors"][io["tensor"]]
        p = work / f"{io['name']}.npy"
        np.save(p, rng.standard_normal(t["shape"]).astype(t["dtype"]))
        out[io["name"]] = p
    return out


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def run_variants(package: Path, inputs: dict[str, Path] | None = None, table: Path | None = None,
                 runtime: Path | None = None, work: Path | None = None, timeout: float = 20.0,
                 only: list[str] | None = None, keep: bool = False, log=None, engine: str = "packrt-run") -> list[Row]:
    """Runs packrt-run (`runtime`, default the package's own), or with engine="onnxruntime" the
    package's wrapper model with its custom-op library, on every variant of `package` and
    classifies each result against the undamaged package's outputs. Writes the Markdown table
    to `table` if given. A variant's folder is kept under `work` when its outcome is neither
    clean nor correct (or always with keep=True)."""
    base = Path(package).resolve()
    own = base / "runtime" / os.uname().machine / "bin" / "packrt-run"
    exe = Path(runtime) if runtime else own
    work = Path(work) if work else Path(tempfile.mkdtemp(prefix="malformed-"))
    work.mkdir(parents=True, exist_ok=True)
    work = work.resolve()
    inputs = dict(inputs) if inputs else default_inputs(base, work)
    rel = {k: host_target(json.loads((base / "manifest.json").read_text()))[k] for k in ("plan", "kernels", "weights")}

    def prepare(name: str) -> tuple[Case, Path]:
        d = work / _safe(name)
        shutil.rmtree(d, ignore_errors=True)
        (d / "scratch").mkdir(parents=True)
        if engine == "onnxruntime":
            shutil.copytree(base, d / "pkg", symlinks=True, ignore=ort_engine.ignore_for_copy(base))
        else:
            copy_package(base, d / "pkg")
        return Case(d / "pkg", d / "scratch", dict(inputs), rel), d

    def execute_variant(case: Case, out: Path, native: bool = False):
        if engine == "onnxruntime":
            return ort_engine.execute_ort(ort_engine.library(base), case, out, timeout)
        return execute(own if native else exe, case, out, timeout, native=native)

    case, d = prepare("_reference")
    rc, err, _ = execute_variant(case, d / "out")
    if rc != 0:
        raise RuntimeError(f"the undamaged package does not run ({_exit_text(rc, timeout)}): {err.strip()[-2000:]}")
    reference = load_outputs(d / "out")
    if not reference:
        raise RuntimeError("the undamaged package wrote no outputs")

    rows = []
    for v in variants():
        if only and not any(o in v.name for o in only):
            continue
        if engine == "onnxruntime" and v.cls in ort_engine.PACKRT_RUN_ONLY:
            continue
        case, d = prepare(v.name)
        before = snapshot(case.pkg)
        try:
            v.mutate(case)
        except Exception as e:
            raise RuntimeError(f"variant {v.name}: the mutation itself failed: {e!r}") from e
        if v.sign:
            resign(case.pkg, before)
            if engine == "onnxruntime":
                repin(case.pkg)
        rc, err, secs = execute_variant(case, d / "out", v.native)
        judged = ALLOCATION_WARNING.sub("", err)
        prefix = ort_engine.PREFIX if engine == "onnxruntime" else "packrt-run: error:"
        outcome = classify(rc, judged, lambda out=d / "out": outputs_equal(out, reference), prefix)
        message = first_line(judged, outcome).replace(f"{work}/", "")   # variant folders: relative
        rows.append(Row(v.name, v.cls, outcome, _exit_text(rc, timeout), message, secs, err))
        if log:
            log(f"{v.name:45s} {outcome:9s} {rows[-1].exit:8s} {rows[-1].message[:100]}")
        if not keep and outcome in ("clean", "correct"):
            shutil.rmtree(d, ignore_errors=True)
    if table:
        what = f"onnxruntime with `{ort_engine.library(base)}`" if engine == "onnxruntime" else f"packrt-run `{exe}`"
        write_table(rows, Path(table), title=f"{what} on variants of `{base}` (in `{work}`)")
    return rows


def _cell(text: str, limit: int = 180) -> str:
    text = text.replace("|", "\\|").replace("`", "'")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_table(rows: list[Row], path: Path, title: str = "") -> None:
    counts = {o: sum(r.outcome == o for r in rows) for o in OUTCOMES}
    lines = [f"# Malformed packages{': ' + title if title else ''}", "",
             f"{len(rows)} variants: " + ", ".join(f"{n} {o}" for o, n in counts.items() if n) +
             f"; {sum(r.seconds for r in rows):.0f} s", "",
             "| variant | class | outcome | exit | first line of stderr |", "|---|---|---|---|---|"]
    lines += [f"| {r.name} | {r.cls} | {r.outcome} | {r.exit} | {_cell(r.message)} |" for r in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


