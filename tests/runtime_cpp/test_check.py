"""packrt-run --check: a package checks itself against the reference data stored at build time
(reference/: seeded inputs, onnxruntime's outputs), on x86-64 and arm64 (qemu), with no Python;
a corrupted reference or kernel makes it fail, a package without reference data says so."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from support.helpers import HAS_QEMU
from support.packrt import cli, run
from support.resign import resign

pytestmark = pytest.mark.slow


@pytest.fixture
def cnn(packages, tmp_path):
    dst = tmp_path / "cnn"
    shutil.copytree(packages["cnn"], dst, symlinks=True)
    return dst


def test_the_package_holds_its_reference(packages):
    pkg = packages["cnn"]
    m = json.loads((pkg / "manifest.json").read_text())
    ref = json.loads((pkg / m["reference"]).read_text())
    assert ref["format"] == "packager-reference" and [p["name"] for p in ref["profiles"]] == ["default"]
    files = [f for p in ref["profiles"] for kind in ("inputs", "outputs") for f in p[kind].values()]
    assert files and all(f in m["files"] for f in files)          # listed and hashed like every file
    report = json.loads((pkg / "build_report.json").read_text())
    assert report["reference"].startswith("reference data stored"), report["reference"]


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_check_passes_where_the_target_runs(packages, arch):
    if arch == "aarch64" and not HAS_QEMU:
        pytest.skip("qemu-aarch64 is not installed")
    r = run([*cli(packages["cnn"], arch), packages["cnn"], "--check"])
    target = "x86-64" if arch == "x86_64" else "arm64"
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"  {target}  default  ok" in r.stdout, r.stdout


def test_all_targets_skips_the_ones_that_cannot_run_here(packages):
    r = run([*cli(packages["cnn"]), packages["cnn"], "--check", "--all-targets"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "  x86-64  default  ok" in r.stdout and "  arm64  skipped: " in r.stdout, r.stdout


def test_a_corrupted_reference_fails(cnn):
    rel = "reference/default/out-0.npy"
    out = np.load(cnn / rel)
    out.flat[0] += 0.01 * np.abs(out).max()
    np.save(cnn / rel, out)
    resign(cnn, rel)
    r = run([*cli(cnn), cnn, "--check"])
    assert r.returncode == 1 and "MISMATCH" in r.stdout and "(logits)" in r.stdout, r.stdout + r.stderr


def test_a_wrong_kernel_fails(cnn):
    """Weights scaled by 1.001 (re-signed so the runtime loads them): the kernels' results drift
    by far less than a wrong kernel's, and --check still catches it."""
    w = cnn / "targets" / "x86-64" / "weights.bin"
    w.write_bytes((np.frombuffer(w.read_bytes(), np.float32) * np.float32(1.001)).tobytes())
    resign(cnn, "targets/x86-64/weights.bin")
    r = run([*cli(cnn), cnn, "--check"])
    assert r.returncode == 1 and "x86-64  default  MISMATCH" in r.stdout, r.stdout + r.stderr


def test_without_reference_data_nothing_is_checked(cnn):
    m = json.loads((cnn / "manifest.json").read_text())
    del m["reference"]
    (cnn / "manifest.json").write_text(json.dumps(m))
    r = run([*cli(cnn), cnn, "--check"])
    assert r.returncode == 2 and "has no reference data" in r.stderr, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def qdq_cnn(sample_root, tmp_path_factory):
    """The cnn sample quantized by onnxruntime (QDQ, per-channel, u8 activations / s8 weights), built untimed."""
    import yaml
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from packager.build import build
    from packager.spec import load_spec

    folder = tmp_path_factory.mktemp("qdq")
    rng = np.random.default_rng(0)
    feeds = iter([{"image": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)} for _ in range(4)])

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)

    quantize_static(str(sample_root / "cnn" / "model.onnx"), str(folder / "model.onnx"), Reader(),
                    quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    spec = {"name": "qcnn", "model": "model.onnx", "inputs": {"image": {"dtype": "float32", "shape": [1, 3, 64, 64]}},
            "targets": ["x86-64"], "optimize": {"tuning": {"measure": False}}}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
    return build(load_spec(folder / "spec.yaml"), log=lambda m: None)


def test_a_dequantized_output_may_be_one_step_off_but_not_two(qdq_cnn, tmp_path):
    """reference.json carries the output's quantization step; --check allows one step in up to half
    of the elements (flips propagated through the quantized layers), never two."""
    pkg = tmp_path / "qcnn"
    shutil.copytree(qdq_cnn, pkg, symlinks=True)
    ref = json.loads((pkg / "reference" / "reference.json").read_text())
    step = ref["steps"]["logits"]
    assert ref["flips"] > 0 and step > 0
    r = run([*cli(pkg), pkg, "--check"])
    assert r.returncode == 0 and "dequantized outputs up to one step" in r.stdout, r.stdout + r.stderr
    rel = ref["profiles"][0]["outputs"]["logits"]
    out = np.load(pkg / rel)
    out.flat[::3] += np.float32(step)                       # a third of the logits one step off
    np.save(pkg / rel, out)
    resign(pkg, rel)
    r = run([*cli(pkg), pkg, "--check"])
    assert r.returncode == 0, r.stdout + r.stderr
    out.flat[0] += np.float32(step)                         # one of them two steps off
    np.save(pkg / rel, out)
    resign(pkg, rel)
    r = run([*cli(pkg), pkg, "--check"])
    assert r.returncode == 1 and "MISMATCH" in r.stdout, r.stdout + r.stderr


def test_a_reduced_precision_target_is_checked_at_its_own_tolerance(cnn):
    """reference.json's `targets` entry (written for fp16 targets) widens that target's bound: an
    output 0.5% of the tensor's scale off fails at the spec's tolerance and passes at fp16's, and
    the line says which tolerance held."""
    rel = "reference/default/out-0.npy"
    out = np.load(cnn / rel)
    out.flat[0] += 0.005 * np.abs(out).max()
    np.save(cnn / rel, out)
    resign(cnn, rel)
    assert run([*cli(cnn), cnn, "--check"]).returncode == 1
    m = json.loads((cnn / "manifest.json").read_text())
    ref_rel = m["reference"]
    ref = json.loads((cnn / ref_rel).read_text())
    ref["targets"] = {"x86-64": {"rtol": 1e-2, "atol": 1e-3, "precision": "fp16"}}
    (cnn / ref_rel).write_text(json.dumps(ref))
    resign(cnn, ref_rel)
    r = run([*cli(cnn), cnn, "--check"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "  x86-64  default  ok" in r.stdout and "(rtol 0.01, atol 0.001: reduced precision)" in r.stdout, r.stdout
