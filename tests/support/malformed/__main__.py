"""By hand: PYTHONPATH=tests python -m support.malformed [--sanitized] --table malformed.md PKG"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..sanitized import build_sanitized_runtime
from .runner import run_variants
from .variants import variants


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run packrt-run on malformed variants of a built package.")
    ap.add_argument("package", type=Path, nargs="?", help="a built package folder (e.g. the cnn sample's)")
    ap.add_argument("--table", type=Path, help="write the Markdown table here")
    ap.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                    help="inputs (default: random, seed 7, of the first profile's shapes)")
    rt = ap.add_mutually_exclusive_group()
    rt.add_argument("--sanitized", action="store_true", help="build (once, cached) and use the ASan+UBSan packrt-run")
    rt.add_argument("--runtime", type=Path, help="this packrt-run instead of the package's own")
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--onnxruntime", action="store_true",
                    help="run the wrapper model in onnxruntime with the package's custom-op library instead")
    ap.add_argument("--only", action="append", help="only variants whose name contains this (repeatable)")
    ap.add_argument("--work", type=Path, help="folder for the variants (default: a new temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep every variant's folder")
    ap.add_argument("--list", action="store_true", help="list the variants and exit")
    ap.add_argument("--build-only", action="store_true", help="build the sanitized runtime, print its path, exit")
    a = ap.parse_args(argv)
    if a.list:
        for v in variants():
            print(f"{v.cls:12s} {v.name}")
        return 0
    if a.build_only:
        print(build_sanitized_runtime(log=lambda m: print(m, file=sys.stderr)))
        return 0
    if a.package is None:
        ap.error("a package folder is needed")
    runtime = build_sanitized_runtime(log=lambda m: print(m, file=sys.stderr)) if a.sanitized else a.runtime
    inputs = dict(s.split("=", 1) for s in a.input) if a.input else None
    inputs = {k: Path(v).resolve() for k, v in inputs.items()} if inputs else None
    t0 = time.monotonic()
    rows = run_variants(a.package, inputs, a.table, runtime, a.work, a.timeout, a.only, a.keep, log=print,
                        engine="onnxruntime" if a.onnxruntime else "packrt-run")
    bad = [r for r in rows if r.outcome not in ("clean", "correct")]
    print(f"{len(rows)} variants in {time.monotonic() - t0:.0f} s; {len(bad)} neither clean nor correct"
          + (f"; table: {a.table}" if a.table else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
