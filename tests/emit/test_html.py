"""report.html: `pack build` writes it, `pack bench` adds the measured times, `pack report` redraws
it; the page is self-contained (no network, no scripts) and loads in headless Chromium without
console errors, with the graph drawn; the test leaves a screenshot."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from support.helpers import run_pack

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian: apt-get install chromium)")


def _chromium(url: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", *flags, url],
                          capture_output=True, text=True, timeout=180)


def _console_errors(stderr: str) -> list[str]:
    """Console messages of the page (Chromium logs them as CONSOLE lines)."""
    return [ln for ln in stderr.splitlines() if "CONSOLE" in ln]


def _copy(pkg: Path, tmp_path: Path) -> Path:
    dst = tmp_path / pkg.name
    shutil.copytree(pkg, dst)
    return dst


def test_build_writes_a_self_contained_report(packages):
    pkg = packages["cnn"]
    page = (pkg / "report.html").read_text()
    assert "report.html" not in json.loads((pkg / "manifest.json").read_text())["files"]   # a view, not signed
    assert "<script" not in page and not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert page.count("<svg") >= 3                      # per target: graph and roofline
    for section in ("Targets", "Target x86-64", "Target arm64", "Graph after fusion", "Roofline", "Passes",
                    "Layouts chosen"):
        assert section in page, section
    assert "layout-packed" in page and "No measured times yet" in page


@needs_chromium
def test_report_loads_in_headless_chromium_with_the_graph_drawn(packages, tmp_path):
    pkg = _copy(packages["cnn"], tmp_path)
    r = run_pack("report", pkg)
    assert r.returncode == 0 and "report.html" in r.stdout, r.stderr
    url = (pkg / "report.html").as_uri()
    dom = _chromium(url, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console_errors(dom.stderr) == []
    assert len(re.findall(r'<g id="node\d+" class="node"', dom.stdout)) >= 5          # dot drew the kernels
    shot = tmp_path / "report.png"
    r = _chromium(url, f"--screenshot={shot}", "--window-size=1280,1600")
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (1600, 1280) and np.std(pixels[..., :3]) > 0.05       # not a blank page
    print(f"screenshot: {shot}")


@needs_chromium
def test_console_errors_would_be_seen(tmp_path):
    """The check above can fail: a page with a script error is caught."""
    page = tmp_path / "broken.html"
    page.write_text("<html><body><p>x</p><script>no_such_function();</script></body></html>")
    assert any("no_such_function" in ln for ln in _console_errors(_chromium(page.as_uri(), "--dump-dom").stderr))


def test_bench_adds_kernel_times_to_the_report(packages, tmp_path):
    pkg = _copy(packages["mlp"], tmp_path)
    r = run_pack("bench", pkg, "--iters", "3", "--rounds", "1", "--warmup", "1", "--threads", "1", "--top", "1")
    assert r.returncode == 0, r.stderr
    bench = json.loads((pkg / "bench.json").read_text())
    kernels = bench["profiles"][0]["kernels"]
    assert len(kernels) > 1                              # all kept, not just the --top shown
    page = (pkg / "report.html").read_text()
    assert "Where the time goes" in page and "kernels, measured (pack bench)" in page
    assert all(k["kernel"] in page for k in kernels)
    assert run_pack("inspect", pkg).returncode == 0      # the extra files do not disturb the package


def test_without_graphviz_the_page_says_why(packages, tmp_path, monkeypatch):
    from packager.emit import html
    from packager.emit.html import graph

    monkeypatch.setattr(graph.shutil, "which", lambda _name: None)
    page = html.render(_copy(packages["mlp"], tmp_path))
    assert "graph not drawn: Graphviz's dot is not installed" in page
