"""`pack bench` runs end to end and reports what it promises (timings are never asserted)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from support.helpers import run_pack
from packager.frontend import LoadedModel, TensorInfo, import_relax
from packager.optimize.kernel_cost import kernel_cost
from packager.codegen.graph import extract_graph
from packager.optimize.pipeline import optimize_graph
from packager.spec import OptimizeSpec


@pytest.mark.slow
def test_bench_reports_ratio_memory_ablation_and_roofline(packages, tmp_path):
    out = tmp_path / "bench.json"
    r = run_pack("bench", packages["mlp"], "--threads", "2", "--iters", "3", "--rounds", "1", "--warmup", "1",
                 "--ablate", "fusion", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report["threads"] == 2 and [p["profile"] for p in report["profiles"]] == ["default", "batch16"]
    prof = report["profiles"][1]
    assert [v["variant"] for v in prof["variants"]] == ["ours", "no fusion"]
    for v in prof["variants"]:
        assert v["median_ms"] > 0 and v["ratio_median"] > 0 and v["peak_mb"] > 0 and v["build_s"] > 0
        assert isinstance(v["build_programs_timed"], int)
    assert prof["onnxruntime"]["median_ms"] > 0
    top = prof["kernels"][0]
    assert top["kernel"].startswith("fused_matmul") and top["gflops"] > 0 and top["roofline_fraction"] > 0
    assert "top kernels (batch16)" in r.stdout
    roof = report["roofline"]                          # the peaks the fractions are of, and their basis
    assert roof["gflops"] > 0 and roof["gbs"] > 0 and "GHz this machine reports" in roof["basis"]


@pytest.mark.slow
def test_bench_under_a_twin_times_one_thread_too(cnn_copy, tmp_path):
    out = tmp_path / "bench.json"                   # a copy: bench redraws the package's report.html
    r = run_pack("bench", cnn_copy, "--threads", "2", "--iters", "3", "--rounds", "1", "--warmup", "1",
                 "--load", "twin", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report["load"] == "twin" and "beside a twin process" in r.stdout
    variants = report["profiles"][0]["variants"]
    assert [(v["variant"], v["threads"]) for v in variants] == [("ours", 2), ("ours 1 thread", 1)]
    assert all(v["median_ms"] > 0 for v in variants) and report["profiles"][0]["onnxruntime"]["median_ms"] > 0


def test_a_load_is_none_twin_or_busy_loops():
    from packager.errors import UserError
    from packager.tools.load import Load

    assert Load.parse("busy:3") == Load("busy", 3) and Load.parse("twin").kind == "twin"
    for bad in ("busy", "busy:0", "busy:x", "twins"):
        with pytest.raises(UserError, match="expected none, twin, busy:N"):
            Load.parse(bad)


def test_busy_loops_run_only_while_a_round_is_timed():
    import psutil

    from packager.tools.load import Load

    me = psutil.Process()
    before = {c.pid for c in me.children()}
    with Load("busy", 2).beside(None):
        loops = [c for c in me.children() if c.pid not in before]
        assert len(loops) == 2 and all(c.is_running() for c in loops)
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in loops)


def test_bench_rejects_unknown_ablation(packages):
    r = run_pack("bench", packages["mlp"], "--iters", "1", "--rounds", "1", "--ablate", "magic")
    assert r.returncode == 2 and "unknown pass" in r.stderr


def test_kernel_cost_counts_matmul_work_and_traffic():
    m, k, n = 8, 32, 16
    g = helper.make_graph([helper.make_node("Gemm", ["a", "b", "c"], ["y"])], "g",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                          [numpy_helper.from_array(np.ones((k, n), np.float32), "b"),
                           numpy_helper.from_array(np.ones(n, np.float32), "c")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    loaded = LoadedModel(None, model, 17, [TensorInfo("a", "float32", (m, k))], [TensorInfo("y", "float32", ())])
    mod, _ = optimize_graph(import_relax(loaded, {"a": (m, k)}, {"a": "float32"})[0], OptimizeSpec(level=1))
    graph = extract_graph(mod, ["a"], ["y"])
    (func,) = graph.kernels.values()
    cost = kernel_cost(func)
    assert cost.flops == 2 * m * n * k + m * n                    # multiply-accumulate + bias add
    assert cost.bytes == 4 * (m * k + k * n + n + m * n)
    onnx.checker.check_model(model)


def test_the_precision_ablation_rebuilds_every_target_at_fp32(tmp_path, monkeypatch):
    """`--ablate precision`: the same spec with optimize.precision fp32, beside the fp16 package."""
    from types import SimpleNamespace

    import packager.build
    from packager.tools.bench import _ablated

    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    seen = {}

    def build(spec, log=print):
        seen["spec"] = spec
        raise RuntimeError("stop here")

    monkeypatch.setattr(packager.build, "build", build)
    raw = {"name": "m", "model": "m.onnx", "inputs": {"x": {"dtype": "float32", "shape": [1, 4]}},
           "targets": ["h100"], "optimize": {"precision": {"h100": "fp16"}}}
    pkg = SimpleNamespace(manifest={"spec": raw, "source_model": {"path": str(model)}})
    with pytest.raises(RuntimeError, match="stop here"):
        _ablated(pkg, "precision", tmp_path / "ablate")
    assert seen["spec"].optimize.precision_of("h100") == "fp32" and not seen["spec"].optimize.reduced()
