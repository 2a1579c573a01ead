"""The roofline plot (matplotlib, SVG inline): the target's compute and memory ceilings and one
point per kernel at its arithmetic intensity: its measured GFLOP/s where `pack bench` results are
present, else its attainable GFLOP/s (the ceiling at that intensity, marked as such)."""
from __future__ import annotations

import io

import numpy as np

# Fixed margins that fit the labels: tight_layout laid out every tick label once more on every
# build (0.30 -> 0.26 s per plot without it).
MARGINS = {"left": 0.09, "right": 0.98, "bottom": 0.12, "top": 0.93}


def roofline_svg(kernels: list[dict], peak_gflops: float, peak_gbs: float, title: str, measured: bool) -> str:
    """kernels: {kernel, intensity, gflops (when measured)}; returns an <svg> element."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=100)
    fig.subplots_adjust(**MARGINS)
    points = [k for k in kernels if k.get("intensity", 0) > 0]
    lo = min([k["intensity"] for k in points] + [0.1]) / 2
    hi = max([k["intensity"] for k in points] + [peak_gflops / peak_gbs * 4]) * 2
    x = np.geomspace(lo, hi, 200)
    ax.loglog(x, np.minimum(peak_gflops, x * peak_gbs), color="#444444", linewidth=1.5,
              label=f"roofline: {peak_gflops:.0f} GFLOP/s, {peak_gbs:.0f} GB/s")
    if points:
        xs = [k["intensity"] for k in points]
        ys = [k["gflops"] if measured else min(peak_gflops, k["intensity"] * peak_gbs) for k in points]
        ax.scatter(xs, ys, s=28, color="#3d85c6" if measured else "#bbbbbb", zorder=3,
                   label="kernels, measured (pack bench)" if measured else "kernels at their ceiling (not measured)")
        named = sorted(zip(points, xs, ys), key=lambda t: -t[0].get("ms", 0))[:5] if measured else []
        for k, xv, yv in named:                          # the five slowest kernels
            ax.annotate(_short(k["kernel"]), (xv, yv), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    ax.legend(fontsize=8, loc="lower right")
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def _short(name: str, n: int = 28) -> str:
    return name if len(name) <= n else name[:n - 3] + "..."
