"""`pack inspect PKG`: what a package holds (targets, profiles, kernels, memory, passes, what runs in
ONNX Runtime) and whether its files are intact."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from ..codegen.backend import backend_for
from ..emit.manifest import open_package, sha256_file
from ..frontend.lowering import describe_lowered


def inspect_package(package: Path, log: Callable[[str], None] = print) -> list[str]:
    """Print the summary; returns the file problems (empty when every size and checksum matches)."""
    pkg = open_package(package)
    m = pkg.manifest
    log(f"package {m['name']} (packager {m['packager_version']}) from {m['source_model']['path']}")
    for io in ("inputs", "outputs"):
        for t in m[io]:
            log(f"  {io[:-1]:6s} {t['name']}: {t['dtype']} {t['shape']}")
    for p in m["profiles"]:
        log(f"  profile {p['name']}: " + ", ".join(f"{k}{v}" for k, v in p["inputs"].items()))
    report_path = pkg.root / m.get("build_report", "build_report.json")
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    opset = report.get("frontend", {}).get("opset", {})
    if opset.get("converted"):
        log(f"  opset {opset['source']} -> {opset['compiled']} ({opset['how']}); {opset['check']}")
    for where, f in report.get("frontend", {}).get("folding", {}).items():
        if f["folded_by_onnxruntime"] or f["rewritten"] or f.get("note"):
            lowered = f"; lowered {describe_lowered(f['lowered'])}" if f.get("lowered") else ""
            log(f"  frontend {where}: {f['folded_by_onnxruntime']} node(s) folded by onnxruntime, {f['rewritten']} "
                f"rewritten{lowered}{'; ' + f['note'] if f.get('note') else ''}")
    for r in report.get("targets", []):
        arenas = ", ".join(f"{p['name']} {p['arena_bytes'] / 1e6:.2f} MB" for p in r.get("profiles", []))
        part = f" [part {r['part']}]" if r.get("part") else ""
        what = backend_for(r).inspect_line(r)
        log(f"  target {r['name']}{part}: {what}, "
             f"{r.get('kernels', '?')} kernels, weights {r.get('weights_bytes', 0) / 1e6:.2f} MB, arena {arenas}")
        if not r.get("part") or r["part"] == "p0":
            for p in r.get("kernel_passes", []):
                log(f"    pass {p['pass']}: {p['status']}: {p['summary']}")
    for p in report.get("graph_passes", []):
        log(f"  pass {p['pass']}: {p['status']}: {p['summary']}")
    offload = report.get("onnxruntime", {})
    for n in offload.get("kept_nodes", []):
        log(f"  in ONNX Runtime: {n['name'] or '?'} ({n['op_type']}): {n['reason']}")
    libs = ", ".join(sorted(m.get("ort", {}).get("library", {}))) or "none"
    log(f"  ONNX Runtime: {m.get('ort', {}).get('model', '-')} with custom-op library for {libs}")
    for line in runtime_sizes(m):
        log(line)
    problems = pkg.check_files()
    log(f"  manifest sha256: {sha256_file(pkg.root / 'manifest.json')} (pin: packrt-run --expect-sha256, "
        "C API expected_sha256)")
    total = sum(f["bytes"] for f in m["files"].values())
    log(f"  files: {len(m['files'])}, {total / 1e6:.1f} MB, "
         + ("all sizes and checksums match, the wrapper pins this manifest" if not problems
            else f"{len(problems)} PROBLEM(S)"))
    for p in problems:
        log(f"    {p}")
    return problems


def runtime_sizes(m: dict) -> list[str]:
    """One line per architecture: the size of each runtime binary and the ONNX Runtime library."""
    files = m["files"]
    lines = []
    for arch, rt in sorted(m.get("runtime", {}).items()):
        paths = [rt.get(k) for k in ("library", "cli", "example", "static_library")]
        paths.append(m.get("ort", {}).get("library", {}).get(arch))
        sizes = [f"{Path(p).name} {files[p]['bytes'] / 1e6:.2f} MB" for p in paths if p and p in files]
        lines.append(f"  runtime {arch}: " + ", ".join(sizes))
    return lines
