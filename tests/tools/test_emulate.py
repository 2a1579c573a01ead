"""`pack verify --gpu-emulate` (tools/emulate.py): a CUDA target's plan run with its kernels as
OpenCL on PoCL. The runner on a hand-written plan (launch grids, scratch buffers, copies, NaN
where nothing wrote); then real packages: a sample built for h100 verifies on PoCL, and the same
sample with a wrong tile bound planted in one scheduled kernel fails."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from packager.errors import UserError
from support.helpers import run_pack

cl = pytest.importorskip("pyopencl")

ADD_ONE = """
__kernel void add_one(__global float* restrict y, __global const float* restrict x, __global float* restrict s) {
  int i = get_group_id(0) * get_local_size(0) + get_local_id(0);
  s[i] = x[i] + 0.5f;
  y[i] = s[i] + 0.5f;
}
__kernel void first_half(__global float* restrict y, __global const float* restrict x) {
  int i = get_group_id(0) * get_local_size(0) + get_local_id(0);
  if (i < 32) y[i] = x[i];
}
"""


def _target(folder: Path, kernel: str, emulated: bool = True) -> dict:
    """A one-kernel CUDA 'package' in folder: x (64 floats) -> kernel -> y, then y copied to out."""
    tensors = [{"dtype": "float32", "shape": [64], "bytes": 256, "storage": "arena", "offset": o} for o in (0, 256, 512)]
    plan = {"kernels": [{"name": "k", "symbol": kernel, "num_args": 2, "launches": []}],
            "weights": {"file": "weights.bin", "bytes": 0},
            "profiles": [{"name": "default", "tensors": tensors, "inputs": [{"name": "x", "tensor": 0}],
                          "outputs": [{"name": "out", "tensor": 2}],
                          "steps": [{"op": "kernel", "kernel": 0, "args": [0, 1], "outputs": 1},
                                    {"op": "copy", "args": [1, 2]}]}]}
    args = [1, 0, -1] if kernel == "add_one" else [1, 0]
    entry = ({"emulated": True, "launches": [{"function": kernel, "args": args, "grid": [4, 1, 1],
                                               "block": [16, 1, 1], "shared_bytes": 0, "cooperative": False}],
              "workspace": [256] if kernel == "add_one" else [], "differences": []}
             if emulated else {"emulated": False, "reason": "no OpenCL form of a tensor-core intrinsic"})
    t = folder / "targets" / "h100"
    (t / "emulation").mkdir(parents=True)
    (t / "plan.json").write_text(json.dumps(plan))
    (t / "weights.bin").write_bytes(b"")
    (t / "emulation" / "kernels.cl").write_text(ADD_ONE)
    (t / "emulation" / "emulation.json").write_text(json.dumps({"kernels": {"k": entry}}))
    return {"name": "h100", "kind": "cuda", "plan": "targets/h100/plan.json", "weights": "targets/h100/weights.bin",
            "emulation": "targets/h100/emulation/emulation.json"}


def test_a_plan_runs_its_launches_scratch_and_copies(tmp_path):
    from packager.tools.emulate import emulate, read_emulation

    target = _target(tmp_path, "add_one")
    x = np.arange(64, dtype=np.float32)
    out = emulate(tmp_path, target, "default", {"x": x})["out"]
    np.testing.assert_array_equal(out, x + 1)
    assert read_emulation(tmp_path, target)[2].summary() == "1 of 1 kernels emulated on PoCL"


def test_kernel_names_of_any_length_run(tmp_path):
    """PoCL aborts on a cache file name past its limit; fused kernels' names run that long."""
    from packager.tools.emulate import emulate

    long = "fused_" + "reshape_transpose_split_squeeze_matmul_" * 8 + "add_one"
    target = _target(tmp_path, "add_one")
    folder = tmp_path / "targets" / "h100" / "emulation"
    (folder / "kernels.cl").write_text(ADD_ONE.replace("add_one(", f"{long}("))
    doc = json.loads((folder / "emulation.json").read_text())
    doc["kernels"]["k"]["launches"][0]["function"] = long
    (folder / "emulation.json").write_text(json.dumps(doc))
    x = np.arange(64, dtype=np.float32)
    np.testing.assert_array_equal(emulate(tmp_path, target, "default", {"x": x})["out"], x + 1)


def test_what_no_kernel_wrote_is_nan(tmp_path):
    from packager.tools.emulate import emulate

    out = emulate(tmp_path, _target(tmp_path, "first_half"), "default", {"x": np.ones(64, np.float32)})["out"]
    assert (out[:32] == 1).all() and np.isnan(out[32:]).all()


def test_a_kernel_without_an_opencl_form_is_named(tmp_path):
    from packager.tools.emulate import emulate

    with pytest.raises(UserError, match="kernel 'k' has no OpenCL form \\(no OpenCL form of a tensor-core"):
        emulate(tmp_path, _target(tmp_path, "add_one", emulated=False), "default", {"x": np.ones(64, np.float32)})


def test_a_package_without_the_opencl_form_says_rebuild(tmp_path):
    from packager.tools.emulate import emulate

    target = _target(tmp_path, "add_one")
    shutil.rmtree(tmp_path / "targets" / "h100" / "emulation")
    with pytest.raises(UserError, match="no OpenCL form of its kernels .*rebuild it"):
        emulate(tmp_path, target, "default", {"x": np.ones(64, np.float32)})


def test_gpu_emulate_on_a_package_without_cuda_targets_is_one_line(packages):
    r = run_pack("verify", packages["cnn"], "--gpu-emulate")
    assert r.returncode == 2
    assert "no CUDA target" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# ---- real packages ------------------------------------------------------------------------------

def _cuda_spec(sample_root: Path, out: Path, targets: list[str]) -> Path:
    spec = yaml.safe_load((sample_root / "cnn" / "spec.yaml").read_text())
    spec.update(targets=targets, model=str(sample_root / "cnn" / "model.onnx"), output=str(out))
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _wrong_tile_bound(func):
    """The scheduled kernel with its first serial loop one iteration short (a tile bound off by one)."""
    import tvm

    text = func.script()
    loop = re.search(r"for (\w+) in range\(T\.int64\((\d+)\)\):", text)
    if loop is None or int(loop.group(2)) < 2:
        return None
    short = f"for {loop.group(1)} in range(T.int64({int(loop.group(2)) - 1})):"
    return tvm.script.from_source(text[:loop.start()] + short + text[loop.end():])


@pytest.mark.slow
def test_a_cuda_package_verifies_on_pocl_and_a_planted_tile_bug_is_caught(sample_root, tmp_path, monkeypatch):
    from packager.build import build
    from packager.codegen import cuda
    from packager.spec import load_spec
    from packager.tools.verify import verify_package

    good = build(load_spec(_cuda_spec(sample_root, tmp_path / "good", ["h100"])), log=lambda m: None)
    lines: list[str] = []
    results = verify_package(good, gpu_emulate=True, log=lines.append)
    emulated = [r for r in results if r.emulated]
    assert [r.status for r in emulated] == ["pass"], lines
    assert re.search(r"h100 on PoCL: (\d+) of \1 kernels emulated on PoCL", "\n".join(lines)), lines

    planted: list[str] = []
    real = cuda.CudaBackend.compile

    def compile_with_a_bug(self, kernels, target, folder, w):
        kernels = dict(kernels)
        for name, f in kernels.items():
            wrong = None if planted else _wrong_tile_bound(f)
            if wrong is not None:
                kernels[name] = wrong.with_attr("global_symbol", name)
                planted.append(name)
        return real(self, kernels, target, folder, w)

    monkeypatch.setattr(cuda.CudaBackend, "compile", compile_with_a_bug)
    bad = build(load_spec(_cuda_spec(sample_root, tmp_path / "bad", ["h100"])), log=lambda m: None)
    assert planted
    results = verify_package(bad, gpu_emulate=True, log=lines.append)
    assert [r.status for r in results if r.emulated] == ["fail"], (planted, lines)
