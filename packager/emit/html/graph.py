"""The model graph after fusion, as the plan runs it: one node per kernel call (a profile's steps),
edges where one call's output is another's input, colored by the pass that shaped the kernel;
drawn by Graphviz's `dot` (Debian: graphviz) as inline SVG."""
from __future__ import annotations

import html
import shutil
import subprocess

# (tag, fill color, what it means): the first tag a kernel carries colors it
TAGS = [
    ("derived", "#f6b26b", "EinNet derive: a derived Matmul / eOperator"),
    ("global fusion", "#b4a7d6", "Souffle global fusion: kernels merged beyond FuseOps"),
    ("layout-packed", "#9fc5e8", "ALT layout: packed (blocked) data or weights"),
    ("fused", "#b6d7a8", "FuseOps: element-wise ops folded into an anchor"),
    ("plain", "#eeeeee", "one graph op, no pass changed it"),
]
ORT_COLOR = "#ea9999"           # nodes left in ONNX Runtime
MAX_NODES = 400                 # beyond this dot takes long and the picture is unreadable


def kernel_tags(name: str, schedule: str | None) -> list[str]:
    """What shaped a kernel, from its name (every pass names its kernels) and its schedule line."""
    tags = []
    if "derived" in name:
        tags.append("derived")
    if name.startswith("gf_"):
        tags.append("global fusion")
    if "packed" in name:
        tags.append("layout-packed")
    if name.startswith("fused_"):
        tags.append("fused")
    tags = tags or ["plain"]
    if schedule:
        tags.append("Gensor" if schedule.startswith("gensor") else "rule-based schedule")
    return tags


def color(tags: list[str]) -> str:
    return next(c for t, c, _ in TAGS if t in tags or t == "plain")


def dot_source(plan: dict, profile: dict, schedules: dict[str, str], kernel_ms: dict[str, float],
               kept_in_ort: list[dict]) -> str:
    """Graphviz source for one profile's steps (kernel calls; copies shown as small boxes)."""
    lines = ["digraph plan {", '  rankdir=TB; bgcolor="transparent";',
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
             '  edge [color="#888888", arrowsize=0.6];']
    producer: dict[int, str] = {}
    for i in profile["inputs"]:
        node = f"in_{i['tensor']}"
        lines.append(f'  {node} [label="{_q(i["name"])}", shape=ellipse, fillcolor="#ffffff"];')
        producer[i["tensor"]] = node
    for n, step in enumerate(profile["steps"][:MAX_NODES]):
        node = f"s{n}"
        ins, outs = _io(step)
        if step["op"] == "kernel":
            k = plan["kernels"][step["kernel"]]
            tags = kernel_tags(k["name"], schedules.get(k["name"]))
            ms = kernel_ms.get(k["name"])
            label = [k["name"], *([f"{ms:.3f} ms"] if ms is not None else []), ", ".join(tags)]
            bold = ', penwidth=2' if "Gensor" in tags else ""
            lines.append(f'  {node} [label="{_lines(label)}", fillcolor="{color(tags)}"{bold}];')
        else:
            lines.append(f'  {node} [label="{_q(step["op"])}", shape=box, fontsize=8, fillcolor="#ffffff"];')
        lines += [f"  {producer[t]} -> {node};" for t in dict.fromkeys(ins) if t in producer]
        producer.update({t: node for t in outs})
    for o in profile["outputs"]:
        if o["tensor"] in producer:
            lines.append(f'  out_{o["tensor"]} [label="{_q(o["name"])}", shape=ellipse, fillcolor="#ffffff"];')
            lines.append(f"  {producer[o['tensor']]} -> out_{o['tensor']};")
    for n, kept in enumerate(kept_in_ort):
        label = _lines([f"{kept.get('name') or '?'} ({kept['op_type']})", "in ONNX Runtime"])
        lines.append(f'  ort{n} [label="{label}", fillcolor="{ORT_COLOR}"];')
    lines.append("}")
    return "\n".join(lines)


def _io(step: dict) -> tuple[list[int], list[int]]:
    """(input tensors, output tensors) of a plan step: a kernel's outputs are its last args, a
    copy's or an assembly's its last."""
    args = step.get("args", [])
    n_out = step.get("outputs", 1) if step["op"] == "kernel" else 1
    return args[:len(args) - n_out], args[len(args) - n_out:]


def _lines(parts: list[str]) -> str:
    """A multi-line dot label (each line quoted)."""
    return "\\n".join(_q(p) for p in parts)


def _q(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def render_svg(source: str) -> tuple[str | None, str]:
    """(inline SVG, "") or (None, why it could not be drawn)."""
    dot = shutil.which("dot")
    if dot is None:
        return None, "Graphviz's dot is not installed (Debian/Ubuntu: apt-get install graphviz)"
    r = subprocess.run([dot, "-Tsvg"], input=source, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None, "dot failed: " + html.escape(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "?")
    svg = r.stdout
    return svg[svg.index("<svg"):], ""
