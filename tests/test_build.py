"""End to end: spec -> package -> `pack verify` against onnxruntime, for samples, pass switches and
graph shapes that stress the plan (outputs that alias inputs, constants or each other)."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from support.helpers import HAS_QEMU, run_pack, save_model, write_spec
from support.resign import resign
from packager.emit.package import sha256_file

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["cnn", "mlp", "transformer"])
def test_sample_verifies_on_x86_and_arm64(packages, name):
    if not HAS_QEMU:
        pytest.skip("qemu-aarch64 not installed")
    r = run_pack("verify", packages[name])
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("  ")]
    assert {ln.split()[0] for ln in lines} == {"x86-64", "arm64", "onnxruntime"}   # + the ORT wrapper check
    assert all(" ok " in ln for ln in lines), r.stdout
    n_profiles = len(json.loads((packages[name] / "manifest.json").read_text())["profiles"])
    assert len(lines) == 3 * n_profiles


def test_package_layout_and_manifest(packages):
    pkg = packages["mlp"]
    m = json.loads((pkg / "manifest.json").read_text())
    assert m["format"] == "packager-package" and m["version"] == 1
    assert [t["name"] for t in m["targets"]] == ["x86-64", "arm64"]
    assert set(m["runtime"]) == {"x86_64", "aarch64"}
    assert [p["name"] for p in m["profiles"]] == ["default", "batch16"]
    for rel, f in m["files"].items():
        assert (pkg / rel).stat().st_size == f["bytes"]
        assert sha256_file(pkg / rel) == f["sha256"]
    plan = json.loads((pkg / "targets" / "x86-64" / "plan.json").read_text())
    assert plan["format"] == "packager-plan" and len(plan["profiles"]) == 2
    for prof in plan["profiles"]:
        for t in prof["tensors"]:
            assert t["offset"] % 64 == 0
        assert prof["arena_bytes"] <= sum(t["bytes"] for t in prof["tensors"] if t["storage"] == "arena")
    # both profiles share one weights.bin (identical constants are stored once)
    weights = (pkg / "targets" / "x86-64" / "weights.bin").stat().st_size
    assert weights < 1.2 * sum(a.nbytes for a in _initializers(m["source_model"]["path"]))
    assert (pkg / "runtime" / "src" / "third_party" / "nlohmann" / "json.hpp").is_file()
    report = json.loads((pkg / "build_report.json").read_text())
    statuses = {p["pass"]: p["status"] for p in report["graph_passes"]}
    assert statuses["fusion"] == "applied" and "derive" not in statuses          # per target, below
    derive = {t["name"]: {p["pass"]: p for p in t["kernel_passes"]}["derive"] for t in report["targets"]}
    assert all(p["status"] == "applied" and p["details"]["sites"] == [] for p in derive.values())


def _initializers(path):
    return [numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer]


def test_verify_detects_wrong_results(packages, tmp_path):
    """Corrupt the weights *and* re-sign the manifest: the runtime loads it, verify must fail."""
    pkg = tmp_path / "cnn"
    shutil.copytree(packages["cnn"], pkg)
    w = pkg / "targets" / "x86-64" / "weights.bin"
    data = bytearray(w.read_bytes())
    data[64:128] = bytes(64)
    w.write_bytes(bytes(data))
    resign(pkg, "targets/x86-64/weights.bin")
    r = run_pack("verify", pkg, "--target", "x86-64")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL" in r.stdout and "exceed the tolerance" in r.stderr


CNN_SPEC = """\
name: cnn
model: {model}
inputs:
  image: {{dtype: float32, shape: [1, 3, 64, 64]}}
targets: [x86-64]
optimize: {opt}
"""


@pytest.mark.parametrize("opt", [
    "{level: 0}",                                  # no pass at all: TVM's naive loops
    "{passes: {simplify: false}}",
    "{passes: {fusion: false}}",
    "{passes: {schedule: false}}",
    "{passes: {fastmath: false}}",
    "{passes: {layout: false}}",
    "{passes: {global_fusion: false}}",
    "{passes: {pad_inline: false}}",
])
def test_each_pass_switch_keeps_results_equal(sample_root, tmp_path, opt):
    spec = write_spec(tmp_path, CNN_SPEC.format(model=sample_root / "cnn" / "model.onnx", opt=opt))
    r = run_pack("build", spec)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "dist" / "cnn" / "build_report.json").read_text())
    statuses = {p["pass"]: p["status"] for p in report["graph_passes"] + report["targets"][0]["kernel_passes"]}
    for name in ("simplify", "fastmath", "fusion", "global_fusion", "schedule", "layout", "pad_inline"):
        off = opt == "{level: 0}" or re.search(rf"\b{name}: false", opt) is not None
        assert statuses[name] == ("disabled" if off else "applied"), statuses
    r = run_pack("verify", tmp_path / "dist" / "cnn")
    assert r.returncode == 0, r.stdout + r.stderr


def test_each_cpu_target_gets_its_own_layouts(packages):
    """The cnn sample for x86-64 and arm64: one layout pass per target, blocks of that target's
    vector width (AVX-512 16 / AVX2 8 lanes, or twice that; NEON 4 or 8), conversions counted.
    Propagation never adds conversions; on arm64 (decided analytically, so the same every build)
    it removes some. x86-64's layouts are measured here, and on this 2-core machine the measured
    choice between NCHW and a packed layout flips from run to run for some of the convs (1 to 2 of
    5 packed, seen in CI and locally with the same code), so fewer conversions is not asserted."""
    report = json.loads((packages["cnn"] / "build_report.json").read_text())
    lanes = {"x86-64": {8, 16, 32}, "arm64": {4, 8}}
    for t in report["targets"]:
        layout = next(p for p in t["kernel_passes"] if p["pass"] == "layout")
        assert layout["status"] == "applied" and layout["details"]["packed"] >= 1, layout["summary"]
        d = layout["details"]
        assert d["conversions_after"] <= d["conversions_before"]
        if t["name"] == "arm64":
            assert d["conversions_after"] < d["conversions_before"]
        blocks = {int(c["layouts"][2][4:-1]) for c in d["per_conv"] if c["layouts"][2] != "NCHW"}
        assert blocks and blocks <= lanes[t["name"]], (t["name"], blocks)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _build_and_verify(tmp_path, model, inputs_yaml, targets="[x86-64]"):
    save_model(model, tmp_path / "model.onnx")
    spec = write_spec(tmp_path, f"name: edge\nmodel: model.onnx\ninputs:\n{inputs_yaml}targets: {targets}\n")
    r = run_pack("build", spec)
    assert r.returncode == 0, r.stderr
    r = run_pack("verify", tmp_path / "dist" / "edge")
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp_path / "dist" / "edge"


def test_outputs_that_alias_inputs_constants_and_each_other(tmp_path):
    f = TensorProto.FLOAT
    c = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(2, 4), "c")
    nodes = [helper.make_node("Identity", ["x"], ["same_as_input"]),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Identity", ["r"], ["r_again"]),
             helper.make_node("Identity", ["c"], ["const_out"]),
             helper.make_node("Add", ["r", "c"], ["sum"])]
    outs = [helper.make_tensor_value_info(n, f, [2, 4]) for n in ("same_as_input", "r", "r_again", "const_out", "sum")]
    pkg = _build_and_verify(tmp_path, _model(nodes, [helper.make_tensor_value_info("x", f, [2, 4])], outs, [c]),
                            "  x: {shape: [2, 4]}\n")
    plan = json.loads((pkg / "targets" / "x86-64" / "plan.json").read_text())
    tensors = [o["tensor"] for o in plan["profiles"][0]["outputs"]]
    assert len(set(tensors)) == 5                        # every output has its own buffer
    assert sum(s["op"] == "copy" for s in plan["profiles"][0]["steps"]) >= 3


def test_integer_inputs_and_outputs(tmp_path):
    table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((10, 6)).astype(np.float32), "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
             helper.make_node("ReduceSum", ["emb", "axes"], ["pooled"], keepdims=0),
             helper.make_node("ArgMax", ["pooled"], ["best"], axis=1, keepdims=0)]
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    model = _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
                   [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [2, 6]),
                    helper.make_tensor_value_info("best", TensorProto.INT64, [2])], [table, axes])
    _build_and_verify(tmp_path, model, "  ids: {dtype: int64, shape: [2, 3]}\n")


def test_external_data_model(tmp_path, sample_root):
    m = onnx.load(str(sample_root / "transformer" / "model.onnx"))
    onnx.save(m, str(tmp_path / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx.data", size_threshold=1024)
    assert (tmp_path / "model.onnx.data").stat().st_size > 100_000
    spec = write_spec(tmp_path, "name: ext\nmodel: model.onnx\ntargets: [x86-64]\n")
    assert run_pack("build", spec).returncode == 0
    r = run_pack("verify", tmp_path / "dist" / "ext")
    assert r.returncode == 0, r.stdout + r.stderr


def test_arm64_only_package_is_cross_built(tmp_path, sample_root):
    if not HAS_QEMU:
        pytest.skip("qemu-aarch64 not installed")
    spec = write_spec(tmp_path, f"name: mlp\nmodel: {sample_root / 'mlp' / 'model.onnx'}\n"
                                "inputs: {features: {shape: [2, 256]}}\n"
                                "targets: [{name: a78, kind: cpu, arch: arm64, mcpu: cortex-a78ae}]\n")
    assert run_pack("build", spec).returncode == 0
    m = json.loads((tmp_path / "dist" / "mlp" / "manifest.json").read_text())
    assert list(m["runtime"]) == ["aarch64"] and m["targets"][0]["mcpu"] == "cortex-a78ae"
    r = run_pack("verify", tmp_path / "dist" / "mlp")
    assert r.returncode == 0 and "a78" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("sample,inputs", [("cnn", "image: {shape: [1, 3, 64, 64]}"),
                                           ("transformer", "tokens: {shape: [1, 32, 64]}")])
def test_arm64_fp16_package_verifies_under_qemu(tmp_path, sample_root, sample, inputs):
    """optimize.precision fp16 for an Arm CPU with the FP16 extension (Orin's Cortex-A78AE): fp16
    weights, kernels with fp16 instructions, a runtime that checks the CPU has them, and outputs
    within fp16's tolerance of onnxruntime (run under qemu)."""
    if not HAS_QEMU:
        pytest.skip("qemu-aarch64 not installed")
    spec = write_spec(tmp_path, f"name: s\nmodel: {sample_root / sample / 'model.onnx'}\ninputs: {{{inputs}}}\n"
                                "targets: [{name: a78, kind: cpu, arch: arm64, mcpu: cortex-a78ae}]\n"
                                "optimize: {precision: fp16}\n")
    r = run_pack("build", spec)
    assert r.returncode == 0, r.stdout + r.stderr
    pkg = tmp_path / "dist" / "s"
    target = json.loads((pkg / "manifest.json").read_text())["targets"][0]
    assert target["precision"] == "fp16" and {"fphp", "asimdhp"} <= set(target["cpu_features"])
    weights = (pkg / "targets" / "a78" / "weights.bin").stat().st_size
    assert weights < 0.6 * sum(a.nbytes for a in _initializers(sample_root / sample / "model.onnx"))
    dump = subprocess.run(["aarch64-linux-gnu-objdump", "-d", str(pkg / "targets" / "a78" / "kernels.so")],
                          capture_output=True, text=True, check=True).stdout
    assert re.search(r"\tfcvtl\s|\tf(add|mul|mla|max)\s+v\d+\.[48]h", dump), "no fp16 instructions in the kernels"
    r = run_pack("verify", pkg)
    assert r.returncode == 0 and " a78 " in r.stdout and "fp16: mean err" in r.stdout, r.stdout + r.stderr
    bad = write_spec(tmp_path / "generic", spec.read_text().replace(", mcpu: cortex-a78ae", ""))
    r = run_pack("build", bad)
    assert r.returncode == 2 and "mcpu: cortex-a78ae" in r.stderr and "+fullfp16" in r.stderr, r.stderr


@pytest.mark.parametrize("sample,inputs", [("cnn", "image: {shape: [1, 3, 64, 64]}"),
                                           ("transformer", "tokens: {shape: [1, 32, 64]}")])
def test_x86_bf16_package_computes_on_amx_tiles(tmp_path, sample_root, sample, inputs):
    """optimize.precision bf16 for an x86 CPU with AMX-BF16 (Sapphire Rapids): bf16 weight panels,
    tdpbf16ps kernels, a runtime that checks for (and asks Linux for) the tiles, and outputs within
    bf16's tolerance of onnxruntime where this machine has AMX; a generic x86-64 is told what to name."""
    spec = write_spec(tmp_path, f"name: s\nmodel: {sample_root / sample / 'model.onnx'}\ninputs: {{{inputs}}}\n"
                                "targets: [{name: spr, kind: cpu, arch: x86_64, mcpu: sapphirerapids}]\n"
                                "optimize: {precision: bf16}\n")
    r = run_pack("build", spec)
    assert r.returncode == 0 and "precision [spr]: applied: bf16:" in r.stdout, r.stdout + r.stderr
    pkg = tmp_path / "dist" / "s"
    target = json.loads((pkg / "manifest.json").read_text())["targets"][0]
    assert target["precision"] == "bf16" and {"amx_tile", "amx_bf16"} <= set(target["cpu_features"])
    weights = (pkg / "targets" / "spr" / "weights.bin").stat().st_size
    assert weights < 0.8 * sum(a.nbytes for a in _initializers(sample_root / sample / "model.onnx"))
    dump = subprocess.run(["objdump", "-d", str(pkg / "targets" / "spr" / "kernels.so")],
                          capture_output=True, text=True, check=True).stdout
    assert "tdpbf16ps" in dump and "ldtilecfg" in dump
    if "amx_bf16" in open("/proc/cpuinfo").read():
        r = run_pack("verify", pkg)
        assert r.returncode == 0 and " spr " in r.stdout and "bf16: mean err" in r.stdout, r.stdout + r.stderr
    bad = write_spec(tmp_path / "generic", spec.read_text().replace("{name: spr, kind: cpu, arch: x86_64, "
                                                                    "mcpu: sapphirerapids}", "x86-64"))
    r = run_pack("build", bad)
    assert r.returncode == 2 and "mcpu: sapphirerapids" in r.stderr and "+amx-bf16" in r.stderr, r.stderr


@pytest.mark.parametrize("sample,opset", [("cnn", 11), ("mlp", 11), ("mlp", 21), ("transformer", 21)])
def test_opset_range(tmp_path, sample, opset):
    from make_samples import make_cnn, make_mlp, make_transformer

    model = {"cnn": make_cnn, "mlp": make_mlp, "transformer": make_transformer}[sample](opset=opset)
    _build_and_verify(tmp_path, model, "  features: {shape: [3, 256]}\n" if sample == "mlp" else "")


@pytest.mark.parametrize("which", ["mobile_block", "attention_block"])
def test_operator_coverage_models(tmp_path, which):
    from support import probe_models

    pkg = _build_and_verify(tmp_path, getattr(probe_models, which)(), "", targets="[x86-64, arm64]"
                            if HAS_QEMU else "[x86-64]")
    report = json.loads((pkg / "build_report.json").read_text())
    schedule = next(p for p in report["targets"][0]["kernel_passes"] if p["pass"] == "schedule")
    assert schedule["details"]["rules"].get("naive", 0) == 0


def test_gather_indices_stay_in_bounds(tmp_path):
    """Negative indices work; an out-of-range index must not crash the process (ONNX Gather
    in TVM's "fast" mode reads out of bounds; the packager uses wrap-around)."""
    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    model = _model([helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)],
                   [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
                   [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [3, 4])], [table])
    pkg = _build_and_verify(tmp_path, model, "  ids: {dtype: int64, shape: [3]}\n")
    np.save(tmp_path / "ids.npy", np.array([-1, 2, 1_000_000], np.int64))
    exe = pkg / "runtime" / "x86_64" / "bin" / "packrt-run"
    import subprocess
    r = subprocess.run([str(exe), str(pkg), "--input", f"ids={tmp_path / 'ids.npy'}", "--output-dir", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = np.load(tmp_path / "rows.npy")
    assert rows[0].tolist() == [36, 37, 38, 39] and rows[1].tolist() == [8, 9, 10, 11]


def test_recurrent_layers_build_as_one_loop_kernel_per_direction(tmp_path):
    """300 steps of a bidirectional GRU then a reverse LSTM: one loop kernel per direction on every
    target (x86-64 timed, arm64 untimed and checked, h100 cross-built and run on PoCL), and the
    packages verify."""
    rng = np.random.default_rng(0)
    w = lambda name, *shape: numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
    nodes = [helper.make_node("GRU", ["x", "Wg", "Rg", "Bg"], ["g"], hidden_size=32, direction="bidirectional"),
             helper.make_node("Reshape", ["g", "shape"], ["g2"]),
             helper.make_node("LSTM", ["g2", "Wl", "Rl"], ["y", "h_last"], hidden_size=16, direction="reverse")]
    shape = numpy_helper.from_array(np.array([300, 1, 64], np.int64), "shape")
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [300, 1, 20])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [300, 1, 1, 16]),
                    helper.make_tensor_value_info("h_last", TensorProto.FLOAT, [1, 1, 16])],
                   [w("Wg", 2, 96, 20), w("Rg", 2, 96, 32), w("Bg", 2, 192), w("Wl", 1, 64, 64), w("Rl", 1, 64, 16),
                    shape])
    targets = "[x86-64, h100" + (", arm64]" if HAS_QEMU else "]")
    pkg = _build_and_verify(tmp_path, model, "  x: {shape: [300, 1, 20]}\n", targets)
    if importlib.util.find_spec("pyopencl"):                    # the GPU form's barriers and indexing, on PoCL
        r = run_pack("verify", pkg, "--target", "h100", "--gpu-emulate")
        assert r.returncode == 0 and re.search(r"h100 on PoCL +default +ok", r.stdout), r.stdout + r.stderr
    report = json.loads((pkg / "build_report.json").read_text())
    for t in report["targets"]:
        kernels = next(p for p in t["kernel_passes"] if p["pass"] == "schedule")["details"]["kernels"]
        loops = {k: v for k, v in kernels.items() if "_loop" in k}
        assert len(loops) == 3 and all(str(v).startswith("recurrence") for v in loops.values()), (t["name"], loops)
