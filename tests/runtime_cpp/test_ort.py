"""Packages in ONNX Runtime through the custom-op library: whole models, partial offload,
errors as Python exceptions, concurrency, and the ORT C++ API."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from support.helpers import HAS_QEMU, ort_run, run_pack, save_model, write_spec
from support.resign import repin
from packager.frontend import load_model, random_inputs

pytestmark = pytest.mark.slow
ARCH = "x86_64"
HERE = Path(__file__).resolve().parent


def session(pkg: Path, model_dir: str | None = None, lib_pkg: Path | None = None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    if model_dir:
        so.add_session_config_entry("ai.packager.model_dir", model_dir)
    so.register_custom_ops_library(str((lib_pkg or pkg) / "ort" / ARCH / "libpackager_ort.so"))
    s = ort.InferenceSession(str(pkg / "ort" / "model.onnx"), so, providers=["CPUExecutionProvider"])
    assert s.get_providers() == ["CPUExecutionProvider"]
    return s


def source(pkg: Path) -> Path:
    return Path(json.loads((pkg / "manifest.json").read_text())["source_model"]["path"])


@pytest.mark.parametrize("name", ["cnn", "mlp", "transformer"])
def test_every_sample_runs_in_onnxruntime(packages, name):
    pkg = packages[name]
    m = json.loads((pkg / "manifest.json").read_text())
    assert m["ort"]["model"] == "ort/model.onnx" and set(m["ort"]["library"]) == {"x86_64", "aarch64"}
    sess = session(pkg)
    model = load_model(source(pkg))
    dtypes = {i["name"]: i["dtype"] for i in m["inputs"]}
    for k, prof in enumerate(m["profiles"]):                 # every shape profile (mlp: batch 4 and 16)
        feeds = random_inputs(model, {n: tuple(s) for n, s in prof["inputs"].items()}, dtypes, seed=k)
        ref = ort_run(source(pkg), feeds)
        for out, got in zip(sess.get_outputs(), sess.run(None, feeds)):
            np.testing.assert_allclose(got, ref[out.name], rtol=m["verify"]["rtol"], atol=m["verify"]["atol"])


def test_wrong_shape_is_a_clean_exception_naming_the_input(packages):
    sess = session(packages["mlp"])                          # dynamic batch: our op checks the profile
    with pytest.raises(Exception) as e:
        sess.run(None, {"features": np.zeros((5, 256), np.float32)})
    assert "features[5,256] match no profile" in str(e.value) and "batch16 (features[16,256])" in str(e.value)
    with pytest.raises(Exception) as e:                      # static dims: ONNX Runtime checks first
        session(packages["cnn"]).run(None, {"image": np.zeros((1, 3, 32, 64), np.float32)})
    assert "image" in str(e.value)
    assert sess.run(None, {"features": np.ones((4, 256), np.float32)})[0].shape == (4, 10)


def test_one_session_from_many_threads_gives_identical_results(packages):
    sess = session(packages["transformer"])
    x = np.random.default_rng(3).standard_normal((1, 32, 64)).astype(np.float32)
    expected = sess.run(None, {"tokens": x})[0]
    mismatches, errors = [], []

    def worker():
        try:
            for _ in range(50):
                if not np.array_equal(sess.run(None, {"tokens": x})[0], expected):
                    mismatches.append(1)
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not mismatches


def test_library_of_another_package_is_detected_and_model_dir_fixes_it(packages):
    cnn, mlp = packages["cnn"], packages["mlp"]
    with pytest.raises(Exception) as e:                      # mlp's wrapper + cnn's library: '..' is cnn
        session(mlp, lib_pkg=cnn)
    # the node pins mlp's manifest: cnn's is another (before the package-id check, kernels.so is never loaded)
    assert "not the package that was expected" in str(e.value) and "ai.packager.model_dir" in str(e.value)
    sess = session(mlp, model_dir=str(mlp / "ort"), lib_pkg=cnn)
    assert sess.run(None, {"features": np.ones((4, 256), np.float32)})[0].shape == (4, 10)


def test_wrapper_opens_only_the_build_it_pins(packages, tmp_path):
    pkg = tmp_path / "cnn"
    shutil.copytree(packages["cnn"], pkg)
    m = json.loads((pkg / "manifest.json").read_text())
    m["name"] = "cnn-rebuilt"                                # any other manifest: another build
    (pkg / "manifest.json").write_text(json.dumps(m, indent=1))
    with pytest.raises(Exception) as e:
        session(pkg)
    assert "PackagedModel node" in str(e.value) and "not the pinned" in str(e.value), str(e.value)
    repin(pkg)                                                # the wrapper pins the new manifest: it opens
    assert session(pkg).run(None, {"image": np.zeros((1, 3, 64, 64), np.float32)})[0].shape == (1, 10)


def test_missing_package_folder_fails_at_session_creation(packages, tmp_path):
    pkg = tmp_path / "cnn"
    shutil.copytree(packages["cnn"], pkg)
    shutil.rmtree(pkg / "targets")
    with pytest.raises(Exception) as e:
        session(pkg)
    assert "PackagedModel node" in str(e.value) and "targets/x86-64" in str(e.value)


@pytest.fixture(scope="module")
def partial_pkg(tmp_path_factory) -> Path:
    from support import probe_models

    root = tmp_path_factory.mktemp("partial")
    save_model(probe_models.partial_offload_model(), root / "model.onnx")
    spec = write_spec(root, "name: partial\nmodel: model.onnx\ninputs:\n  x: {shape: [4, 32]}\n"
                            "profiles:\n  - {name: b8, inputs: {x: {shape: [8, 32]}}}\n"
                            f"targets: [x86-64{', arm64' if HAS_QEMU else ''}]\n")    # fallback is the default
    r = run_pack("build", spec)
    assert r.returncode == 0, r.stderr
    assert "partial offload: 4 compiled part(s), 2 node(s) stay in ONNX Runtime (Gelu, TopK)" in r.stdout
    assert "warning: Gelu, TopK run in ONNX Runtime, not compiled" in r.stdout
    return root / "dist" / "partial"


def test_partial_offload_runs_in_onnxruntime(partial_pkg):
    report = json.loads((partial_pkg / "build_report.json").read_text())["onnxruntime"]
    assert {n["op_type"]: n["reason"] for n in report["kept_nodes"]} == {
        "Gelu": "custom domain com.microsoft", "TopK": "selects k = 40 (compiled: k <= 32)"}
    assert [p["part"] for p in report["offloaded"]] == ["p0", "p1", "p2", "p3"]
    sess = session(partial_pkg)
    kinds = {n.op_type for n in __import__("onnx").load(str(partial_pkg / "ort" / "model.onnx")).graph.node}
    assert kinds == {"PackagedModel", "Gelu", "TopK"}
    for batch in (4, 8):
        x = np.random.default_rng(batch).standard_normal((batch, 32)).astype(np.float32)
        ref = ort_run(source(partial_pkg), {"x": x})
        for out, got in zip(sess.get_outputs(), sess.run(None, {"x": x})):
            np.testing.assert_allclose(got, ref[out.name], rtol=1e-4, atol=1e-5)


def test_partial_offload_verifies_every_part_and_target(partial_pkg):
    r = run_pack("verify", partial_pkg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "x86-64 [p3]" in r.stdout and "onnxruntime    b8" in r.stdout
    if HAS_QEMU:
        assert "arm64 [p0]" in r.stdout


def test_partial_package_explains_itself_to_packrt_run(partial_pkg, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((4, 32), np.float32))
    r = subprocess.run([str(partial_pkg / "runtime" / ARCH / "bin" / "packrt-run"), str(partial_pkg),
                        "--input", f"x={tmp_path / 'x.npy'}"], capture_output=True, text=True)
    assert r.returncode == 2 and "parts of the model run in ONNX Runtime" in r.stderr
    # each part is itself a package the runtime can run
    r = subprocess.run([str(partial_pkg / "runtime" / ARCH / "bin" / "packrt-run"), str(partial_pkg / "parts" / "p0"),
                        "--input", f"x={tmp_path / 'x.npy'}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_keep_ops_leaves_chosen_ops_to_onnxruntime(sample_root, tmp_path):
    spec = write_spec(tmp_path, f"name: tkeep\nmodel: {sample_root / 'transformer' / 'model.onnx'}\n"
                                "targets: [x86-64]\nonnxruntime: {keep_ops: [Softmax]}\n")
    r = run_pack("build", spec)
    assert r.returncode == 0, r.stderr
    pkg = tmp_path / "dist" / "tkeep"
    kept = json.loads((pkg / "build_report.json").read_text())["onnxruntime"]["kept_nodes"]
    assert [n["op_type"] for n in kept] == ["Softmax"]
    r = run_pack("verify", pkg)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cpp_program_through_the_ort_cpp_api(packages, cnn_input, tmp_path):
    from packager.emit.ort_headers import ort_headers

    include, why = ort_headers()
    assert include is not None, why
    # the wheel ships libonnxruntime.so.1.X.Y while its SONAME is libonnxruntime.so.1: link through a symlink
    wheel_lib = next((Path(ort.__file__).parent / "capi").glob("libonnxruntime.so.*"))
    (tmp_path / "libonnxruntime.so.1").symlink_to(wheel_lib)
    exe = tmp_path / "ort_cpp_test"
    r = subprocess.run(["g++", "-std=c++17", "-O1", "-o", str(exe), str(HERE / "ort_cpp_test.cc"),
                        f"-I{include}", str(tmp_path / "libonnxruntime.so.1"), f"-Wl,-rpath,{tmp_path}"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    pkg = packages["cnn"]
    cnn_input[1].tofile(tmp_path / "in.raw")
    r = subprocess.run([str(exe), str(pkg / "ort" / "model.onnx"), str(pkg / "ort" / ARCH / "libpackager_ort.so"),
                        str(tmp_path / "in.raw"), str(tmp_path / "out.raw")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    ours = np.fromfile(tmp_path / "out.raw", np.float32).reshape(1, 10)
    np.testing.assert_allclose(ours, ort_run(source(pkg), {"image": cnn_input[1]})["logits"], rtol=1e-4, atol=1e-5)
