"""`pack report PKG` and the report.html `pack build` writes: one self-contained HTML page (no
network, no scripts, styles inline) of what the build made. It reads the package's own files:
manifest.json, build_report.json, each target's plan.json, and bench.json when `pack bench` has
run on the package (it then redraws the page with the measured times).

Sections, top to bottom: the targets; per target the graph after fusion (graph.py), the kernel
time bars and the roofline plot (roofline.py); the passes (applied / disabled / not
implemented, and what each changed); the layouts chosen; what runs in ONNX Runtime.
report.html is a view, not a package file: it is not listed in the manifest and may be redrawn.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from ...codegen.backend import backend_for
from ..manifest import BENCH_RESULTS
from .graph import ORT_COLOR, TAGS, dot_source, render_svg
from .roofline import roofline_svg

REPORT = "report.html"
BENCH = BENCH_RESULTS         # written by `pack bench` (not a package file either)
STATUS_COLOR = {"applied": "#d9ead3", "disabled": "#eeeeee", "not implemented": "#fce5cd"}

STYLE = """
body { font-family: Helvetica, Arial, sans-serif; margin: 24px; color: #222; max-width: 1200px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ccc; }
h3 { font-size: 15px; } table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } .note { color: #666; font-size: 13px; }
.bar { background: #3d85c6; height: 12px; } .barcell { width: 320px; }
.graph { overflow: auto; max-height: 900px; border: 1px solid #ddd; padding: 6px; }
.swatch { display: inline-block; width: 14px; height: 14px; border: 1px solid #999; vertical-align: middle; }
code { font-size: 12px; }
"""


def render(root: Path) -> str:
    """The page for the package (or staged package) at `root`."""
    manifest = json.loads((root / "manifest.json").read_text())
    report = json.loads((root / manifest.get("build_report", "build_report.json")).read_text())
    bench = json.loads((root / BENCH).read_text()) if (root / BENCH).is_file() else None
    parts = [_header(manifest, report, bench), _targets(manifest, report)]
    for where, t in _plans(root, manifest):
        parts.append(_target_section(where, t, report, bench))
    parts += [_passes(report), _layouts(report), _offload(report)]
    title = f"{html.escape(manifest['name'])}: build report"
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{STYLE}</style></head>\n<body>\n" + "\n".join(parts) + "\n</body></html>\n")


def _plans(root: Path, manifest: dict):
    """(folder its paths are relative to, manifest target) for the package's targets and, for a
    split model, each compiled part's."""
    for t in manifest.get("targets", []):
        yield root, t
    for part in manifest.get("parts", []):
        sub = json.loads((root / part["path"] / "manifest.json").read_text())
        for t in sub.get("targets", []):
            yield root / part["path"], dict(t, part=part["name"])


def write(root: Path) -> Path:
    """(Re)write root/report.html."""
    out = root / REPORT
    out.write_text(render(root))
    return out


def _e(x) -> str:
    return html.escape(str(x))


def _header(m: dict, r: dict, bench: dict | None) -> str:
    opt, measured = r.get("optimize", {}), r.get("measured") or {}
    busy = (f"; other processes kept {measured['busy_cores']:.1f} cores busy meanwhile"
            if measured.get("busy") else "")
    lines = [f"<h1>{_e(m['name'])}</h1>",
             f"<p>model <code>{_e(m['source_model']['path'])}</code>, packager {_e(m['packager_version'])}, "
             f"optimize level {_e(opt.get('level', '?'))}, built in {r.get('seconds', 0):.1f} s"
             f" ({_e(measured.get('programs', 0))} programs timed{_e(busy)})</p>"]
    if bench:
        lines.append(f"<p>times from <code>pack bench</code>: target {_e(bench['target'])}, {bench['threads']} "
                     f"thread(s), vs {_e(bench['reference'])}: " + "; ".join(
                         f"{_e(p['profile'])} {p['variants'][0]['median_ms']:.3f} ms "
                         f"({p['variants'][0]['ratio_median']:.2f}x)" for p in bench["profiles"]) + "</p>")
    else:
        lines.append("<p class=\"note\">No measured times yet: <code>pack bench PKG</code> adds them to this page.</p>")
    return "\n".join(lines)


def _targets(m: dict, r: dict) -> str:
    rows = []
    for t in r.get("targets", []):
        arenas = ", ".join(f"{_e(p['name'])} {p['arena_bytes'] / 1e6:.2f} MB" for p in t.get("profiles", []))
        what = _e(backend_for(t).inspect_line(t))
        rows.append(f"<tr><td>{_e(t['name'])}</td><td>{what}</td><td>{_e(t.get('kernels', '?'))}</td>"
                    f"<td>{t.get('weights_bytes', 0) / 1e6:.2f} MB</td><td>{arenas}</td></tr>")
    return ("<h2>Targets</h2><table><tr><th>target</th><th>what</th><th>kernels</th><th>weights</th>"
            "<th>arena</th></tr>" + "".join(rows) + "</table>")


def _target_section(root: Path, t: dict, r: dict, bench: dict | None) -> str:
    plan = json.loads((root / t["plan"]).read_text())
    rep = next((x for x in r.get("targets", []) if x["name"] == t["name"] and x.get("part") == t.get("part")), {})
    schedules = next((p.get("details", {}).get("kernels", {}) for p in rep.get("kernel_passes", [])
                      if p["pass"] == "schedule"), {})
    timed = bench if bench and bench.get("target") == t["name"] else None
    kernels = timed["profiles"][0]["kernels"] if timed else []
    ms = {k["kernel"]: k["ms"] / k["calls"] for k in kernels}
    profile = plan["profiles"][0]
    kept = [] if t.get("part") else r.get("onnxruntime", {}).get("kept_nodes", [])   # a split model: see the table
    svg, why = render_svg(dot_source(plan, profile, schedules, ms, kept))
    part = f" (part {_e(t['part'])})" if t.get("part") else ""
    out = [f"<h2>Target {_e(t['name'])}{part}</h2>",
           f"<h3>Graph after fusion (profile {_e(profile['name'])}: {len(profile['steps'])} steps)</h3>",
           _legend(), f"<div class=\"graph\">{svg}</div>" if svg else f"<p class=\"note\">graph not drawn: {why}</p>"]
    out.append(_time_bars(kernels) if timed else
               "<p class=\"note\">Kernel times: run <code>pack bench PKG</code> on a machine that runs this target.</p>")
    out.append(_roofline(t, plan, kernels, timed))
    return "\n".join(out)


def _legend() -> str:
    items = [f"<span class=\"swatch\" style=\"background:{c}\"></span> {_e(t)}: {_e(what)}" for t, c, what in TAGS]
    items.append(f"<span class=\"swatch\" style=\"background:{ORT_COLOR}\"></span> left in ONNX Runtime")
    items.append("bold border: scheduled by Gensor (else rule-based)")
    return "<p class=\"note\">" + " &nbsp; ".join(items) + "</p>"


def _time_bars(kernels: list[dict]) -> str:
    top = max((k["ms"] for k in kernels), default=1.0) or 1.0
    rows = [f"<tr><td><code>{_e(k['kernel'])}</code> x{k['calls']}</td><td>{k['ms']:.3f} ms</td>"
            f"<td>{k['share'] * 100:.1f}%</td><td class=\"barcell\"><div class=\"bar\" "
            f"style=\"width:{k['ms'] / top * 100:.1f}%\"></div></td><td>{k['gflops']:.1f} GFLOP/s, "
            f"{k['roofline_fraction'] * 100:.0f}% of roofline ({_e(k['bound'])}-bound)</td></tr>"
            for k in sorted(kernels, key=lambda k: -k["ms"])]
    return ("<h3>Where the time goes (pack bench, per run)</h3><table><tr><th>kernel</th><th>time</th>"
            "<th>share</th><th></th><th>speed</th></tr>" + "".join(rows) + "</table>")


def _roofline(t: dict, plan: dict, kernels: list[dict], timed: dict | None) -> str:
    threads = timed["threads"] if timed else 1
    try:
        peak_gflops, peak_gbs = backend_for(t).roofline_peaks(t, threads)
    except (KeyError, TypeError, ValueError) as e:
        return f"<p class=\"note\">roofline not drawn: {_e(e)}</p>"
    points = kernels or [{"kernel": k["name"], "intensity": k["flops"] / k["bytes"], "ms": k["flops"]}
                         for k in plan["kernels"] if k.get("flops") and k.get("bytes")]
    title = f"{t['name']}, {threads} thread(s)" + ("" if timed else " (ceilings only: not measured)")
    return "<h3>Roofline</h3>" + roofline_svg(points, peak_gflops, peak_gbs, title, measured=bool(timed))


def _passes(r: dict) -> str:
    rows = [_pass_row("graph", p) for p in r.get("graph_passes", [])]
    for t in r.get("targets", []):
        rows += [_pass_row(t["name"], p) for p in t.get("kernel_passes", [])]
    return ("<h2>Passes</h2><table><tr><th>where</th><th>pass</th><th>status</th><th>what it changed</th></tr>"
            + "".join(rows) + "</table>")


def _pass_row(where: str, p: dict) -> str:
    color = STATUS_COLOR.get(p["status"], "#ffffff")
    return (f"<tr><td>{_e(where)}</td><td>{_e(p['pass'])}</td><td style=\"background:{color}\">{_e(p['status'])}</td>"
            f"<td>{_e(p['summary'])}</td></tr>")


def _layouts(r: dict) -> str:
    rows = []
    for t in r.get("targets", []):
        layout = next((p.get("details", {}) for p in t.get("kernel_passes", []) if p["pass"] == "layout"), {})
        for c in layout.get("per_conv", []):
            rows.append(f"<tr><td>{_e(t['name'])}</td><td>conv {_e(c['data'])} * {_e(c['weight'])}</td>"
                        f"<td>{_e(' / '.join(c['layouts']))}</td></tr>")
        for mm in layout.get("per_matmul", []):
            rows.append(f"<tr><td>{_e(t['name'])}</td><td>matmul {_e(mm['a'])} x n={_e(mm['n'])}</td>"
                        f"<td>{'weight panels of ' + str(mm['n_t']) if mm.get('n_t') else 'unpacked'}</td></tr>")
    if not rows:
        return "<h2>Layouts</h2><p class=\"note\">No layout decisions (no conv or matmul was packed).</p>"
    return ("<h2>Layouts chosen</h2><table><tr><th>target</th><th>operator</th><th>data / weight / output</th></tr>"
            + "".join(rows) + "</table>")


def _offload(r: dict) -> str:
    kept = r.get("onnxruntime", {}).get("kept_nodes", [])
    if not kept:
        return "<h2>ONNX Runtime</h2><p>Every node is compiled into the package.</p>"
    rows = "".join(f"<tr><td>{_e(n.get('name') or '?')}</td><td>{_e(n['op_type'])}</td><td>{_e(n['reason'])}</td></tr>"
                   for n in kept)
    return "<h2>Left in ONNX Runtime</h2><table><tr><th>node</th><th>op</th><th>why</th></tr>" + rows + "</table>"
