"""CUDA targets, built offline on a machine without a GPU: every sample for A100, V100, Orin and
H100; each fatbin holds exactly its architecture; every plan launch names a kernel of the module
with the right parameter count; the runtime reports a missing driver cleanly. Tests marked `gpu`
run the packages on a GPU and are skipped without one (the GPU suite, tests/tools/test_gpu_suite.py,
is the device half that runs without the build stack)."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import yaml
from make_samples import SAMPLES
from support.helpers import run_pack
from support.cuda_tools import cuobjdump, elf_arches, kernel_params, ptx_arches

from packager.targets import CUDA_TABLE, host_arch, local_cuda_sm

GPU_TARGETS = ["a100", "v100", "orin", "h100"]
GPU_SM, NO_GPU_WHY = local_cuda_sm()
needs_gpu = pytest.mark.skipif(GPU_SM is None, reason=f"no GPU: {NO_GPU_WHY}")

pytestmark = pytest.mark.skipif(cuobjdump() is None, reason="cuobjdump not installed (pip install -e '.[dev]')")


@pytest.fixture(scope="module")
def cuda_packages(sample_root, tmp_path_factory) -> dict:
    """Every sample built for the four GPU targets, with x86-64 last (so a machine without a GPU
    falls back to it)."""
    from packager.build import build
    from packager.spec import load_spec

    out = {}
    for name in SAMPLES:
        spec = yaml.safe_load((sample_root / name / "spec.yaml").read_text())
        spec["targets"] = GPU_TARGETS + ["x86-64"]
        spec["model"] = str(sample_root / name / "model.onnx")
        spec["output"] = str(tmp_path_factory.mktemp("cuda") / name)
        path = sample_root / name / "spec_cuda.yaml"
        path.write_text(yaml.safe_dump(spec))
        out[name] = build(load_spec(path), log=lambda _msg: None)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("sample", SAMPLES)
def test_fatbins_hold_exactly_the_target_architecture(cuda_packages, sample):
    pkg = cuda_packages[sample]
    for t in GPU_TARGETS:
        fatbin = pkg / "targets" / t / "kernels.fatbin"
        sm = CUDA_TABLE[t].sm
        assert elf_arches(fatbin) == [sm], t
        assert ptx_arches(fatbin) == [sm], t              # PTX of the same arch: newer GPUs can JIT it
        src = (pkg / "targets" / t / "kernels.cu").read_text()
        assert "extern \"C\" __global__" in src


@pytest.mark.slow
@pytest.mark.parametrize("sample", SAMPLES)
def test_every_launch_names_a_module_kernel_with_matching_parameters(cuda_packages, sample):
    pkg = cuda_packages[sample]
    for t in GPU_TARGETS:
        plan = json.loads((pkg / "targets" / t / "plan.json").read_text())
        assert plan["device"] == "cuda" and plan["module"] == "kernels.fatbin"
        params = kernel_params(pkg / "targets" / t / "kernels.fatbin")
        used = set()
        for prof in plan["profiles"]:
            for step in prof["steps"]:
                if step["op"] != "kernel":
                    continue
                k = plan["kernels"][step["kernel"]]
                assert len(step["args"]) == k["num_args"]
                for launch in k["launches"]:
                    fn = launch["function"]
                    assert fn in params, (t, fn)
                    assert params[fn] == len(launch["args"]), (t, fn)
                    assert all(-len(k["workspace"]) <= a < k["num_args"] for a in launch["args"])
                    assert np.prod(launch["block"]) <= CUDA_TABLE[t].facts["max_threads_per_block"]
                    used.add(fn)
        assert used == set(params), (t, set(params) - used)   # no dead kernels in the module


@pytest.mark.slow
@pytest.mark.parametrize("sample", SAMPLES)
def test_every_sample_verifies_on_pocl_for_every_gpu_target(cuda_packages, sample):
    """The scheduled kernels of each GPU target, run as OpenCL on the CPU (`pack verify --gpu-emulate`),
    match onnxruntime: v100's sm_70 schedules as well as the newer ones."""
    from packager.tools.verify import verify_package

    lines: list[str] = []
    results = verify_package(cuda_packages[sample], targets=GPU_TARGETS, gpu_emulate=True, log=lines.append)
    emulated = [r for r in results if r.emulated]
    profiles = json.loads((cuda_packages[sample] / "manifest.json").read_text())["profiles"]
    assert sorted((r.target, r.profile) for r in emulated) == sorted(
        (t, p["name"]) for t in GPU_TARGETS for p in profiles), lines
    assert all(r.status == "pass" for r in emulated), "\n".join(lines)


@pytest.mark.slow
def test_manifest_report_and_orin_host(cuda_packages):
    pkg = cuda_packages["cnn"]
    manifest = json.loads((pkg / "manifest.json").read_text())
    by_name = {t["name"]: t for t in manifest["targets"]}
    assert by_name["orin"]["arch"] == "aarch64" and by_name["orin"]["sm"] == "sm_87"
    assert by_name["h100"]["kernels"] == "targets/h100/kernels.fatbin"
    assert by_name["h100"]["emulation"] == "targets/h100/emulation/emulation.json"
    assert (pkg / "runtime" / "aarch64" / "bin" / "packrt-run").is_file()   # Orin's host runtime
    report = json.loads((pkg / "build_report.json").read_text())
    tr = {t["name"]: t for t in report["targets"]}
    assert tr["v100"]["cuda"]["compiler"] == "nvrtc" and tr["a100"]["cuda"]["compiler"] == "nvcc"
    sched = next(p for p in tr["h100"]["kernel_passes"] if p["pass"] == "schedule")
    assert sched["pass"] == "schedule" and sched["status"] == "applied" and "dlight" in sched["summary"]
    emulation = tr["h100"]["cuda"]["emulation"]
    assert emulation["emulated"] == emulation["kernels"] > 0 and emulation["not_emulated"] == {}
    assert "sm_87" in (pkg / "README.md").read_text()


@pytest.mark.skipif(GPU_SM is not None, reason="this machine has a GPU")
def test_runtime_reports_no_cuda_driver(cuda_packages, cnn_input):
    pkg = cuda_packages["cnn"]
    cli = pkg / "runtime" / host_arch() / "bin" / "packrt-run"
    r = subprocess.run([str(cli), str(pkg), "--target", "h100", "--input", f"image={cnn_input[0]}"],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "target 'h100' cannot run: no CUDA driver" in r.stderr and "libcuda.so.1" in r.stderr
    # With no target named, the GPU targets are passed over for the CPU one.
    r = subprocess.run([str(cli), str(pkg), "--input", f"image={cnn_input[0]}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "target x86-64 (cpu)" in r.stdout
    r = run_pack("verify", pkg)
    assert r.returncode == 0, r.stderr
    assert "h100" in r.stdout and "SKIPPED" in r.stdout


def test_onnxruntime_cpu_session_runs_a_gpu_package_on_its_cpu_target(cuda_packages, cnn_input):
    from packager.frontend.ort_run import ort_session

    pkg = cuda_packages["cnn"]
    lib = pkg / "ort" / host_arch() / "libpackager_ort.so"
    src = json.loads((pkg / "manifest.json").read_text())["source_model"]["path"]
    got = ort_session(str(pkg / "ort" / "model.onnx"), library=lib).run(None, {"image": cnn_input[1]})[0]
    ref = ort_session(src).run(None, {"image": cnn_input[1]})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_custom_cuda_target_and_bad_arch(tmp_path, sample_root):
    from packager.spec import load_spec
    from packager.targets import resolve_all

    spec = yaml.safe_load((sample_root / "mlp" / "spec.yaml").read_text())
    spec["model"] = str(sample_root / "mlp" / "model.onnx")
    spec["targets"] = [{"name": "rtx", "kind": "cuda", "arch": "sm_86"}]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    (t,) = resolve_all(load_spec(tmp_path / "s.yaml"))
    assert t.sm == "sm_86" and t.arch == "x86_64"
    spec["targets"] = [{"name": "old", "kind": "cuda", "arch": "sm_60"}]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    r = run_pack("build", tmp_path / "s.yaml")
    assert r.returncode != 0 and "unknown CUDA architecture 'sm_60'" in r.stderr


# ---- on a GPU ----------------------------------------------------------------------------------

# The device-side checks (every target against its stored reference, CUDA graph vs plain runs,
# packrt_run_device with device pointers, latency vs PyTorch) are the GPU suite's device half:
# tests/tools/test_gpu_suite.py::test_the_suite_on_this_gpu, and `pack gpu-suite` for a lent GPU.

@pytest.mark.gpu
@needs_gpu
def test_gpu_onnxruntime_cuda_ep_runs_the_cuda_target(cuda_packages, cnn_input):
    from packager.frontend.ort_run import cuda_ep_available, ort_session

    if not cuda_ep_available():
        pytest.skip("onnxruntime has no usable CUDA execution provider here")
    pkg = cuda_packages["cnn"]
    lib = pkg / "ort" / host_arch() / "libpackager_ort.so"
    src = json.loads((pkg / "manifest.json").read_text())["source_model"]["path"]
    got = ort_session(str(pkg / "ort" / "model.onnx"), library=lib, cuda=True).run(None, {"image": cnn_input[1]})[0]
    ref = ort_session(src, cuda=True).run(None, {"image": cnn_input[1]})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4)


def test_fused_kernels_with_several_launches_have_every_block_on_the_gpu(tmp_path):
    """A fused reshape/transpose/concat/add/split: dlight's Transpose rule would schedule only the
    transpose (the rest would stay in host code); the pass rejects that and the kernel becomes one
    device launch per output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.random((1, 1, 8), np.float32), "cls"),
             numpy_helper.from_array(rng.random((1, 17, 8), np.float32), "pos"),
             numpy_helper.from_array(np.array([1, 8, 16], np.int64), "shape")]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Concat", ["cls", "t"], ["c"], axis=1),
             helper.make_node("Add", ["c", "pos"], ["y"]),
             helper.make_node("Split", ["y"], ["a", "b"], axis=2, num_outputs=2)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 17, 4]) for n in "ab"], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(tmp_path / "m.onnx"))
    (tmp_path / "spec.yaml").write_text("name: ws\nmodel: m.onnx\ninputs: {x: {dtype: float32, shape: [1, 8, 4, 4]}}\n"
                                        "targets: [h100, x86-64]\n")
    r = run_pack("build", tmp_path / "spec.yaml")
    assert r.returncode == 0, r.stderr
    pkg = tmp_path / "dist" / "ws"
    plan = json.loads((pkg / "targets" / "h100" / "plan.json").read_text())
    (kernel,) = plan["kernels"]
    params = kernel_params(pkg / "targets" / "h100" / "kernels.fatbin")
    assert len(kernel["launches"]) == 2 and {ln["function"] for ln in kernel["launches"]} == set(params)
    outputs = {a for ln in kernel["launches"] for a in ln["args"]}
    assert {3, 4} <= outputs                       # both outputs are written on the GPU
    if GPU_SM is not None:
        r = run_pack("verify", pkg)
        assert r.returncode == 0, r.stdout + r.stderr
