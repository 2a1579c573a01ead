"""fp16 packages for CUDA targets (optimize.precision), built offline: their matmuls run on tensor
cores (HMMA instructions in each architecture's SASS), weights are stored in fp16, and the package
says which precision each target computes in and the tolerance it is checked with. The GPU suite
(`pack gpu-suite --precision fp16`) runs them where a GPU is."""
from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from support.cuda_tools import cuobjdump, sass_counts
from support.helpers import run_pack, save_model

pytestmark = pytest.mark.skipif(cuobjdump() is None, reason="cuobjdump not installed (pip install -e '.[dev]')")


def _mlp(path) -> None:
    """(1, 128, 256) @ (256, 256) -> GELU -> @ (256, 128) -> LayerNorm: matmuls dlight tensorizes."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.06, (256, 256)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.06, (256, 128)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.ones(128, np.float32), "g"), numpy_helper.from_array(np.zeros(128, np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Gelu", ["h"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["y"]),
             helper.make_node("LayerNormalization", ["y", "g", "b"], ["out"], axis=-1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 256])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 128, 128])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 9
    save_model(m, path)


@pytest.mark.slow
def test_fp16_cuda_packages_use_tensor_cores(tmp_path):
    _mlp(tmp_path / "m.onnx")
    spec = ("name: half\nmodel: m.onnx\ninputs: {x: {dtype: float32, shape: [1, 128, 256]}}\n"
            "targets: [h100, a100, x86-64]\noptimize: {precision: {h100: fp16, a100: fp16}}\n")
    (tmp_path / "spec.yaml").write_text(spec)
    (tmp_path / "fp32.yaml").write_text(spec.replace("name: half", "name: full").replace(
        "optimize: {precision: {h100: fp16, a100: fp16}}\n", ""))
    for name in ("spec.yaml", "fp32.yaml"):
        r = run_pack("build", tmp_path / name)
        assert r.returncode == 0, r.stdout + r.stderr
    half, full = tmp_path / "dist" / "half", tmp_path / "dist" / "full"
    targets = {t["name"]: t for t in json.loads((half / "manifest.json").read_text())["targets"]}
    assert targets["h100"]["precision"] == "fp16" and targets["x86-64"]["precision"] == "fp32"
    assert targets["h100"]["verify"] == {"rtol": 1e-2, "atol": 1e-3} and "verify" not in targets["x86-64"]
    ref = json.loads((half / "reference" / "reference.json").read_text())
    assert set(ref["targets"]) == {"h100", "a100"} and ref["targets"]["a100"]["precision"] == "fp16"
    report = json.loads((half / "build_report.json").read_text())
    lines = {(p["pass"], t["name"]): p for t in report["targets"] for p in t["kernel_passes"]}
    assert "on tensor cores" in lines[("schedule", "h100")]["summary"]
    for gpu in ("h100", "a100"):
        size = (half / "targets" / gpu / "weights.bin").stat().st_size
        assert size < 0.6 * (full / "targets" / gpu / "weights.bin").stat().st_size   # fp16 weights
        hmma = sass_counts(half / "targets" / gpu / "kernels.fatbin", r"HMMA\.\S+")
        if hmma is not None:
            assert hmma > 0, gpu
            assert sass_counts(full / "targets" / gpu / "kernels.fatbin", r"HMMA\.\S+") == 0
    r = run_pack("verify", half, "--target", "x86-64")
    assert r.returncode == 0, r.stdout + r.stderr
