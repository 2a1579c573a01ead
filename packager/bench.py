"""`pack bench PKG`: our runtime and onnxruntime (CPU EP) side by side, same inputs and threads.

Rounds alternate between the two so machine noise hits both alike; each round times `iters`
runs after warm-up. Our runtime is timed inside packrt-run (per run, no process start-up),
onnxruntime inside this process around `session.run`.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import InternalError, UserError
from .frontend import load_model, random_inputs
from .package_info import open_package
from .targets import host_arch
from .verify import find_model, runner_command


@dataclass
class BenchResult:
    package: str
    target: str
    profile: str
    threads: int
    ours_ms: list[float]
    ort_ms: list[float]

    def stats(self, xs: list[float]) -> dict[str, float]:
        return {"median_ms": float(np.median(xs)), "p90_ms": float(np.percentile(xs, 90)),
                "min_ms": float(np.min(xs))}

    def as_dict(self) -> dict:
        ours, ort = self.stats(self.ours_ms), self.stats(self.ort_ms)
        return {"package": self.package, "target": self.target, "profile": self.profile, "threads": self.threads,
                "ours": ours, "onnxruntime": ort, "ratio_median": ours["median_ms"] / ort["median_ms"],
                "runs_each": len(self.ours_ms)}


def _time(fn, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _ort_session(model: str, threads: int, library: Path | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if library is not None:
        so.add_session_config_entry("ai.packager.num_threads", str(threads))
        so.register_custom_ops_library(str(library))
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _ours(pkg, target: str | None, threads: int, tmp: Path):
    """What runs "our" side: packrt-run on a target (whole models), or, for models split with ONNX
    Runtime, the wrapper model in onnxruntime with our custom op. Returns (label, runner) where
    runner(inputs, warmup, iters) gives per-run milliseconds."""
    if "parts" in pkg.manifest:
        lib = pkg.manifest.get("ort", {}).get("library", {}).get(host_arch())
        if not lib:
            raise UserError(f"{pkg.root}: split model without a custom-op library for {host_arch()}: nothing to time")
        sess = _ort_session(str(pkg.root / pkg.manifest["ort"]["model"]), threads, pkg.root / lib)

        def run_wrapper(inputs, warmup, iters):
            for _ in range(warmup):
                sess.run(None, inputs)
            return _time(lambda: sess.run(None, inputs), iters)
        return "onnxruntime + packaged parts", run_wrapper

    if target:
        t = pkg.target(target)
    else:
        t = next((x for x in pkg.targets if x["arch"] == host_arch() and runner_command(pkg, x)[0]), None)
        if t is None:
            raise UserError(f"{pkg.root}: no target of this package runs natively here; benchmarks need real hardware")
    cmd, why = runner_command(pkg, t)
    if cmd is None or t["arch"] != host_arch():
        raise UserError(f"target '{t['name']}' cannot be benchmarked here: {why or 'it runs only under emulation'}")
    stats = tmp / "stats.json"

    def run_cli(inputs, warmup, iters):
        args = []
        for i, (name, arr) in enumerate(inputs.items()):
            f = tmp / f"in{i}.npy"
            np.save(f, arr)
            args += ["--input", f"{name}={f}"]
        r = subprocess.run([*cmd, str(pkg.root), "--target", t["name"], *args, "--threads", str(threads),
                            "--warmup", str(warmup), "--iters", str(iters), "--json", str(stats)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise InternalError(f"packrt-run failed: {r.stderr.strip()[-1000:]}")
        return json.loads(stats.read_text())["latency_ms"]
    return t["name"], run_cli


def bench_package(path: Path, target: str | None = None, threads: int = 0, iters: int = 50, rounds: int = 5,
                  warmup: int = 5, model: Path | None = None, log=print) -> list[BenchResult]:
    pkg = open_package(path)
    model_path = find_model(pkg, model)
    threads = threads or os.cpu_count() or 1
    loaded = load_model(model_path)
    dtypes = {i["name"]: i["dtype"] for i in pkg.manifest["inputs"]}
    reference = _ort_session(str(model_path), threads)
    results = []
    with tempfile.TemporaryDirectory(prefix="pack-bench-") as tmp:
        label, ours_runner = _ours(pkg, target, threads, Path(tmp))
        for k, prof in enumerate(pkg.manifest["profiles"]):
            inputs = random_inputs(loaded, {n: tuple(s) for n, s in prof["inputs"].items()}, dtypes, seed=k)
            ours, theirs = [], []
            for _ in range(warmup):
                reference.run(None, inputs)
            for _ in range(rounds):
                ours += ours_runner(inputs, warmup, iters)
                theirs += _time(lambda: reference.run(None, inputs), iters)
            results.append(BenchResult(pkg.name, label, prof["name"], threads, ours, theirs))
    log(f"pack bench {pkg.name} [{label}], {threads} thread(s), {rounds} rounds x {iters} runs, interleaved")
    log(f"  {'profile':10s} {'ours median':>12s} {'ours p90':>10s} {'ORT median':>11s} {'ORT p90':>9s} {'ours/ORT':>9s}")
    for r in results:
        d = r.as_dict()
        log(f"  {r.profile:10s} {d['ours']['median_ms']:10.3f}ms {d['ours']['p90_ms']:8.3f}ms "
            f"{d['onnxruntime']['median_ms']:9.3f}ms {d['onnxruntime']['p90_ms']:7.3f}ms {d['ratio_median']:8.2f}x")
    return results
