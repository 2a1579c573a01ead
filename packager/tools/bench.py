"""`pack bench SPEC|PKG`: our runtime and onnxruntime side by side, same inputs and threads (a CUDA
target, chosen with --target on a machine with a GPU, is compared with onnxruntime's CUDA EP).

Rounds alternate between the runtimes (and `--ablate` variants, each rebuilt with one pass off)
so machine noise hits all of them alike; each round times `iters` runs after warm-up. OpenVINO's CPU
plugin, when installed, is timed in the same rounds as a second peer (openvino_peer.py). Our runtime
is timed inside packrt-run (per run, no process start-up), onnxruntime inside this process around
`session.run`. Memory: the packrt-run process's peak RSS (runtime, weights, arena: the whole
process); for onnxruntime the resident memory a session adds to a fresh Python process after three
runs (the interpreter and onnxruntime's own libraries excluded). One extra profiled run
gives per-kernel time, which with each kernel's FLOPs and compulsory bytes (from its TIR) and the
hardware table's peaks places the slowest kernels on the roofline.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from ..codegen.backend import backend_for
from ..emit.manifest import PackageInfo, open_package
from ..errors import InternalError, UserError
from ..frontend import load_model, random_inputs
from ..spec import PASS_NAMES, load_spec
from ..targets import host_arch, host_ghz
from .load import Load, ort_twin_command, packrt_twin_command
from .opcompare import compare as compare_ops, fastest_ort, fastest_steps, heavy_nodes, ort_node_ms, print_ops
from .openvino_peer import openvino_version, time_openvino
from ..frontend.ort_run import ort_session
from .runners import find_model, runner_command


@dataclass
class Variant:
    """A package and how to time it: packrt-run on a target, or the ORT wrapper for split models."""

    label: str
    pkg: PackageInfo
    target: dict | None
    build_s: float
    timed: int | None = None                                          # candidate programs its build timed
    times: dict[str, list[float]] = field(default_factory=dict)      # profile -> ms per run
    peak_mb: float | None = None
    threads: int | None = None                                       # None: the benchmark's


def _percentiles(xs: list[float]) -> dict[str, float]:
    return {"median_ms": float(np.median(xs)), "p90_ms": float(np.percentile(xs, 90)), "min_ms": float(np.min(xs))}


def _time(fn, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _pick_target(pkg: PackageInfo, name: str | None) -> dict | None:
    if "parts" in pkg.manifest:
        return None
    t = pkg.target(name) if name else next(
        (x for x in pkg.targets if x["arch"] == host_arch() and runner_command(pkg, x)[0]), None)
    if t is None:
        raise UserError(f"{pkg.root}: no target of this package runs natively here; benchmarks need real hardware")
    cmd, why = runner_command(pkg, t)
    if cmd is None or t["arch"] != host_arch():
        raise UserError(f"target '{t['name']}' cannot be benchmarked here: {why or 'it runs only under emulation'}")
    return t


def _save_inputs(inputs: dict[str, np.ndarray], folder: Path) -> list[str]:
    args = []
    for i, (name, arr) in enumerate(inputs.items()):
        f = folder / f"in{i}.npy"
        np.save(f, arr)
        args += ["--input", f"{name}={f}"]
    return args


def _run_cli(v: Variant, args: list[str], threads: int, warmup: int, iters: int, tmp: Path,
             profile: bool = False) -> dict:
    """One packrt-run invocation; returns its JSON stats (latencies, steps, its own peak RSS)."""
    cmd, _ = runner_command(v.pkg, v.target)
    stats = tmp / "stats.json"
    r = subprocess.run([*cmd, str(v.pkg.root), "--target", v.target["name"], *args,
                        "--threads", str(v.threads or threads),
                        "--warmup", str(warmup), "--iters", str(iters), "--json", str(stats),
                        *(["--profile"] if profile else [])], capture_output=True, text=True)
    if r.returncode != 0:
        raise InternalError(f"packrt-run failed: {r.stderr.strip()[-1000:]}")
    return json.loads(stats.read_text())


def _ort_peak_mb(model: Path, feeds: Path, threads: int) -> float:
    """Resident memory an onnxruntime session adds to a fresh process (after three runs), MB;
    `feeds`: the inputs as an .npz."""
    script = (
        "import sys, numpy as np, onnxruntime as ort\n"
        "from packager.frontend.ort_run import ort_session\n"
        "rss = lambda: int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])\n"
        "feeds = dict(np.load(sys.argv[2]))\n"
        "base = rss()\n"
        "s = ort_session(sys.argv[1], int(sys.argv[3]))\n"
        "for _ in range(3): s.run(None, feeds)\n"
        "print((rss() - base) / 1024)\n")
    r = subprocess.run([sys.executable, "-c", script, str(model), str(feeds), str(threads)],
                       capture_output=True, text=True)
    return float(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else float("nan")


def _ablated(pkg: PackageInfo, pass_name: str, out: Path) -> tuple[PackageInfo, float]:
    """Rebuild `pkg` from its recorded spec with one pass switched off (`gensor`: the rule-based
    scheduler instead of the construction-based one; `reuse`: every kernel tuned from scratch, and
    `bridges`: the tuner's reuse tree without ETO's bridges, each into a database of its own;
    `tuning`: level 2, whose choices the database keeps beside level 3's; `precision`: fp32 for
    every target)."""
    from ..build import build

    if pass_name not in PASS_NAMES + ("gensor", "tuning", "precision"):
        raise UserError(f"--ablate {pass_name}: unknown pass; passes: {', '.join(PASS_NAMES)}, gensor, tuning, "
                        "precision")
    raw = json.loads(json.dumps(pkg.manifest["spec"]))
    raw["model"] = pkg.manifest["source_model"]["path"]
    raw.pop("output", None)
    if pass_name == "gensor":
        raw.setdefault("optimize", {})["scheduler"] = "rules"
    elif pass_name == "precision":
        raw.setdefault("optimize", {})["precision"] = "fp32"
    elif pass_name == "tuning":
        opt = raw.setdefault("optimize", {})
        opt["level"] = min(opt.get("level", 2), 2)
        for key in ("trials", "seconds"):
            opt.get("tuning", {}).pop(key, None)
    else:
        raw.setdefault("optimize", {}).setdefault("passes", {})[pass_name] = False
    if pass_name in ("reuse", "reuse_same", "bridges", "window_rows", "pad_inline", "cold_heavy"):   # own empty database: the shared one replays
        raw["optimize"].setdefault("tuning", {})["database"] = str(out / "tuning")
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    t0 = time.perf_counter()
    path = build(load_spec(spec_path, out / "pkg"), log=lambda _m: None)
    return open_package(path), time.perf_counter() - t0


def _build_facts(pkg: PackageInfo) -> tuple[float, int | None]:
    """(build seconds, candidate programs timed by the build) from its report."""
    report = pkg.root / pkg.manifest.get("build_report", "build_report.json")
    r = json.loads(report.read_text()) if report.is_file() else {}
    return r.get("seconds", float("nan")), (r.get("measured") or {}).get("programs")


def kernel_roofline(pkg: PackageInfo, target: dict, steps: list[dict], threads: int, top: int) -> list[dict]:
    """Per kernel (summed over its calls): time share, GFLOP/s, intensity, fraction of roofline."""
    plan = json.loads((pkg.root / target["plan"]).read_text())
    costs = {k["name"]: k for k in plan["kernels"]}
    peak_gflops, peak_gbs = backend_for(target).roofline_peaks(target, threads)
    per: dict[str, dict] = {}
    total = sum(s["ms"] for s in steps) or 1.0
    for s in steps:
        k = per.setdefault(s["kernel"], {"kernel": s["kernel"], "ms": 0.0, "calls": 0})
        k["ms"] += s["ms"]
        k["calls"] += 1
    rows = []
    for k in sorted(per.values(), key=lambda r: -r["ms"])[:top]:
        cost = costs.get(k["kernel"], {})
        flops, nbytes = cost.get("flops", 0) * k["calls"], cost.get("bytes", 0) * k["calls"]
        seconds = k["ms"] / 1e3
        gflops = flops / seconds / 1e9 if seconds else 0.0
        intensity = flops / nbytes if nbytes else 0.0
        attainable = min(peak_gflops, intensity * peak_gbs) if intensity else 0.0
        rows.append({**k, "share": k["ms"] / total, "flops": flops, "bytes": nbytes, "gflops": gflops,
                     "intensity": intensity,
                     "roofline_fraction": gflops / attainable if attainable else 0.0,
                     "bound": "compute" if intensity * peak_gbs >= peak_gflops else "memory"})
    return rows


def _twin(v: Variant, args: list[str], threads: int, feeds: Path) -> list[str]:
    """The command of a twin of variant `v`'s runtime: packrt-run, or the wrapper in onnxruntime."""
    if v.target is None:
        return ort_twin_command(v.pkg.root / v.pkg.manifest["ort"]["model"], threads, feeds,
                                v.pkg.root / v.pkg.manifest["ort"]["library"][host_arch()])
    return packrt_twin_command(runner_command(v.pkg, v.target)[0], v.pkg.root, v.target["name"], args, threads)


def bench(path: Path, target: str | None = None, threads: int = 0, iters: int = 50, rounds: int = 5,
          warmup: int = 5, ablate: list[str] | None = None, top: int = 5, model: Path | None = None,
          log=print, load: Load = Load(), ops: bool = False) -> dict:
    """Benchmark a package (or build one from a spec first); returns the report. Under a `load`
    (see load.py) a packrt-run variant is also timed with one thread, under the same load. `ops`:
    each heavy node's time beside onnxruntime's (opcompare.py), per profile."""
    threads = threads or os.cpu_count() or 1
    if Path(path).suffix in (".yaml", ".yml"):
        from ..build import build
        path = build(load_spec(path), log=lambda _m: None)
    pkg = open_package(path)
    model_path = find_model(pkg, model)
    base = Variant("ours", pkg, _pick_target(pkg, target), *_build_facts(pkg))
    with tempfile.TemporaryDirectory(prefix="pack-bench-") as tmpdir, load.throughout():
        tmp = Path(tmpdir)
        variants = [base]
        for p in ablate or []:
            log(f"  rebuilding without pass '{p}' ...")
            apkg, seconds = _ablated(pkg, p, tmp / f"ablate-{p}")
            variants.append(Variant(f"no {p}", apkg, _pick_target(apkg, base.target and base.target["name"]), seconds,
                                    _build_facts(apkg)[1]))
        on_gpu = bool(base.target) and backend_for(base.target).reference_on_gpu()
        if load.kind != "none" and on_gpu:
            raise UserError("--load applies to CPU benchmarks: a GPU's neighbours are not other processes' threads")
        if load.kind != "none" and base.target is not None and threads > 1:
            variants.append(Variant("ours 1 thread", pkg, base.target, base.build_s, base.timed, threads=1))
        reference = ort_session(str(model_path), threads, cuda=on_gpu)
        wrappers = {id(v): ort_session(str(v.pkg.root / v.pkg.manifest["ort"]["model"]), threads,
                                        v.pkg.root / v.pkg.manifest["ort"]["library"][host_arch()])
                    for v in variants if v.target is None}
        loaded = load_model(model_path)
        dtypes = {i["name"]: i["dtype"] for i in pkg.manifest["inputs"]}
        ort_times: dict[str, list[float]] = {}
        ort_peak: dict[str, float] = {}
        kernels: dict[str, list[dict]] = {}
        op_times: dict[str, dict] = {}
        ov_times: dict[str, list[float]] = {}
        ov_notes: dict[str, str] = {}
        for k, prof in enumerate(pkg.manifest["profiles"]):
            shapes = {n: tuple(s) for n, s in prof["inputs"].items()}
            inputs = random_inputs(loaded, shapes, dtypes, seed=k, values=pkg.manifest.get("verify", {}).get("inputs"))
            args = _save_inputs(inputs, tmp)
            feeds = tmp / "feeds.npz"
            np.savez(feeds, **inputs)
            for _ in range(warmup):
                reference.run(None, inputs)
            timed_ov = not on_gpu and load.kind == "none"         # a twin of OpenVINO is not modelled
            ov_notes[prof["name"]] = "" if timed_ov else "timed only on a CPU target without --load"
            for _ in range(rounds):
                for v in variants:
                    with load.beside(_twin(v, args, threads, feeds)):
                        if v.target is None:
                            sess = wrappers[id(v)]
                            v.times.setdefault(prof["name"], []).extend(
                                _time(lambda s=sess, x=inputs: s.run(None, x), iters))
                        else:
                            stats = _run_cli(v, args, threads, warmup, iters, tmp)
                            v.times.setdefault(prof["name"], []).extend(stats["latency_ms"])
                            v.peak_mb = max(v.peak_mb or 0.0, stats["peak_rss_mb"])
                with load.beside(ort_twin_command(model_path, threads, feeds)):
                    ort_times.setdefault(prof["name"], []).extend(
                        _time(lambda x=inputs: reference.run(None, x), iters))
                if timed_ov and not ov_notes[prof["name"]]:
                    ms, ov_notes[prof["name"]] = time_openvino(model_path, shapes, feeds, threads, warmup, iters)
                    ov_times.setdefault(prof["name"], []).extend(ms or [])
            ort_peak[prof["name"]] = float("nan") if on_gpu else _ort_peak_mb(model_path, feeds, threads)
            if base.target is not None:
                runs = max(iters // 2, 3)
                step_rounds, ort_rounds = [], []
                nodes = heavy_nodes(loaded, shapes) if ops else []
                for _ in range(max(rounds, 1) if ops else 1):    # profiled in alternation with onnxruntime's
                    step_rounds.append(_run_cli(base, args, threads, warmup, runs, tmp, profile=True)["steps"])
                    if ops:
                        ort_rounds.append(ort_node_ms(model_path, inputs, threads, runs, nodes, loaded.proto))
                steps = fastest_steps(step_rounds)
                kernels[prof["name"]] = kernel_roofline(pkg, base.target, steps, threads, len(steps))
                if ops:
                    plan = json.loads((pkg.root / base.target["plan"]).read_text())
                    op_times[prof["name"]] = compare_ops(loaded, model_path, shapes, inputs, plan, steps, threads,
                                                         runs, profile=k, ort=fastest_ort(ort_rounds))
    report = {"package": pkg.name, "target": base.target["name"] if base.target else "onnxruntime + packaged parts",
              "reference": "onnxruntime CUDA EP" if on_gpu else "onnxruntime CPU EP",
              "threads": threads, "rounds": rounds, "iters": iters, "host_ghz": host_ghz(),
              "load": load.label, "load_note": load.describe(threads),
              "profiles": []}
    if base.target is not None:
        gflops, gbs = backend_for(base.target).roofline_peaks(base.target, threads)
        report["roofline"] = {"gflops": gflops, "gbs": gbs,
                              "basis": f"at the {host_ghz():.2f} GHz this machine reports" if base.target.get("kind") == "cpu"
                              else "the datasheet's"}
    for prof in pkg.manifest["profiles"]:
        name = prof["name"]
        ort = _percentiles(ort_times[name])
        ov = _percentiles(ov_times[name]) if ov_times.get(name) else None
        entry = {"profile": name, "onnxruntime": {**ort, "peak_mb": ort_peak.get(name)}, "variants": [],
                 "openvino": {**ov, "version": openvino_version()} if ov else {"note": ov_notes.get(name, "")},
                 "kernels": kernels.get(name, []), **({"ops": op_times[name]} if name in op_times else {})}
        for v in variants:
            ours = _percentiles(v.times[name])
            entry["variants"].append({"variant": v.label, **ours, "threads": v.threads or threads,
                                      "peak_mb": v.peak_mb, "build_s": v.build_s,
                                      "build_programs_timed": v.timed,
                                      "ratio_median": ours["median_ms"] / ort["median_ms"],
                                      "ratio_openvino": ours["median_ms"] / ov["median_ms"] if ov else None})
        report["profiles"].append(entry)
    _print(report, log, top)
    return report


def _print(report: dict, log, top: int) -> None:
    """The table, and the `top` slowest kernels (the report keeps them all)."""
    log(f"pack bench {report['package']} [{report['target']}] vs {report['reference']}, {report['threads']} thread(s), "
        f"{report['rounds']} rounds x {report['iters']} runs, interleaved"
        + (f", each {report['load_note']}" if report.get("load", "none") != "none" else ""))
    log(f"  {'profile':10s} {'variant':12s} {'median':>10s} {'p90':>9s} {'vs ORT':>7s} {'peak MB':>8s} {'build s':>8s} {'timed':>6s}")
    for p in report["profiles"]:
        o = p["onnxruntime"]
        for v in p["variants"]:
            peak = f"{v['peak_mb']:.0f}" if v["peak_mb"] else "-"
            log(f"  {p['profile']:10s} {v['variant']:12s} {v['median_ms']:8.3f}ms {v['p90_ms']:7.3f}ms "
                f"{v['ratio_median']:6.2f}x {peak:>8s} {v['build_s']:8.1f} "
                f"{v['build_programs_timed'] if v['build_programs_timed'] is not None else '-':>6}")
        log(f"  {p['profile']:10s} {'onnxruntime':12s} {o['median_ms']:8.3f}ms {o['p90_ms']:7.3f}ms {'1.00x':>7s} "
            f"{o['peak_mb']:8.0f}")
        ov = p.get("openvino", {})
        if "median_ms" in ov:
            log(f"  {p['profile']:10s} {'openvino':12s} {ov['median_ms']:8.3f}ms {ov['p90_ms']:7.3f}ms "
                f"{ov['median_ms'] / o['median_ms']:6.2f}x   (ours / OpenVINO {p['variants'][0]['ratio_openvino']:.2f}x)")
        elif ov.get("note"):
            log(f"  {p['profile']:10s} {'openvino':12s} - ({ov['note']})")
        if p["kernels"]:
            log(f"  top kernels ({p['profile']}): share, time/run, GFLOP, MB, GFLOP/s, FLOP/byte, roofline fraction")
            for k in p["kernels"][:top]:
                log(f"    {k['share'] * 100:5.1f}%  {k['ms']:8.3f}ms  {k['flops'] / 1e9:7.3f}  {k['bytes'] / 1e6:7.2f}  "
                    f"{k['gflops']:7.1f}  {k['intensity']:7.1f}  {k['roofline_fraction'] * 100:5.1f}% "
                    f"({k['bound']}-bound)  {k['kernel']} x{k['calls']}")
            if p.get("ops"):
                print_ops(p["ops"], log, top)
            roof = report.get("roofline")
            if roof and any(k["roofline_fraction"] > 1 for k in p["kernels"][:top]):
                log(f"  (roofline {roof['gflops']:.0f} GFLOP/s, {roof['gbs']:.0f} GB/s, {roof['basis']}; over 100%: the "
                    f"device ran faster than that, e.g. a boosted clock)")
