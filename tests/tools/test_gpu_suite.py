"""pack gpu-suite: the build-host half writes a bundle that travels (< 60 MB: packages pruned to
what runs, one runtime, device.py, models.py); the device half (device.py) runs it with numpy and
PyTorch only, unchanged on CPU targets here (and on CUDA targets where a GPU is: the `gpu` test)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.helpers import run_pack

pytestmark = pytest.mark.slow

# The device half must run where neither TVM, the packager nor onnxruntime is installed.
WITHOUT_BUILD_STACK = ("import runpy, sys\n"
                       "for m in ('tvm', 'tvm_ffi', 'packager', 'onnxruntime', 'onnx'): sys.modules[m] = None\n"
                       "sys.argv = [sys.argv[1]] + sys.argv[2:]\n"
                       "runpy.run_path(sys.argv[0], run_name='__main__')\n")


def device_half(bundle: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_BUILD_STACK, str(bundle / "device.py"), *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cpu_bundle(tmp_path_factory) -> Path:
    bundle = tmp_path_factory.mktemp("suite") / "bundle"
    r = run_pack("gpu-suite", bundle, "--model", "mlp", "--model", "bert_mini", "--target", "x86-64")
    assert r.returncode == 0, r.stdout + r.stderr
    return bundle


def test_the_bundle_holds_only_what_runs_and_travels(cpu_bundle):
    suite = json.loads((cpu_bundle / "suite.json").read_text())
    assert [m["name"] for m in suite["models"]] == ["mlp", "bert_mini"]
    assert suite["megabytes"] < 60
    assert (cpu_bundle / "bin" / "packrt-run").is_file() and (cpu_bundle / "lib" / "libpackrt.so").is_file()
    for m in suite["models"]:
        pkg = cpu_bundle / m["package"]
        assert sorted(p.name for p in pkg.iterdir()) == ["manifest.json", "reference", "targets"]
        assert m["targets"] == {"x86-64": "cpu"}
    assert suite["models"][1]["torch"] == {"ctor": "Bert", "kwargs": {"vocab": 2000, "dim": 128, "depth": 4,
                                                                     "heads": 2, "mlp": 512},
                                           "seed": 0, "init_transformer": True}


def test_the_device_half_runs_unchanged_on_cpu_targets(cpu_bundle, tmp_path):
    out = tmp_path / "not-yet" / "results.json"        # --out may name a folder that does not exist yet
    r = device_half(cpu_bundle, "--iters", "5", "--no-compile", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(x["model"], x["target"], x["check"], x["c_api_equals_cli"]) for x in rows] == [
        ("mlp", "x86-64", "ok", True), ("bert_mini", "x86-64", "ok", True)]
    bert = rows[1]["pytorch"]
    assert bert["same_weights"] and bert["eager_ms"] > 0 and bert["device"] == "cpu"
    table = out.with_suffix(".md").read_text()
    assert "| model | target | check |" in table and "| bert_mini | x86-64 | ok |" in table


def test_a_damaged_package_fails_the_suite(cpu_bundle, tmp_path):
    import shutil

    bundle = tmp_path / "bundle"
    shutil.copytree(cpu_bundle, bundle)
    ref = bundle / "packages" / "mlp" / "reference" / "default" / "out-0.npy"
    import numpy as np
    out = np.load(ref)
    out.flat[0] += 1.0
    np.save(ref, out)
    r = device_half(bundle, "--iters", "3", "--no-pytorch", "--only", "mlp")
    assert r.returncode == 1 and "mlp            x86-64   FAIL" in r.stdout, r.stdout + r.stderr


@pytest.mark.gpu
def test_the_suite_on_this_gpu(tmp_path):
    """Where this machine has a GPU: the samples for h100 and a100 (PTX JIT on newer GPUs), every
    check of the device half. (On a lent GPU machine without the build stack, carry a bundle built
    elsewhere and run its device.py.)"""
    from packager.targets import local_cuda_sm

    sm, why = local_cuda_sm()
    if sm is None:
        pytest.skip(f"no GPU: {why}")
    bundle = tmp_path / "bundle"
    r = run_pack("gpu-suite", bundle, "--model", "mlp", "--model", "cnn", "--model", "transformer")
    assert r.returncode == 0, r.stdout + r.stderr
    r = device_half(bundle, "--iters", "20")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_model_that_does_not_build_is_named_and_the_rest_travel(tmp_path, monkeypatch):
    import packager.build
    from packager.tools.gpu_suite import build_bundle

    real = packager.build.build

    def build(spec, log=print):
        if spec.name == "mlp":
            raise RuntimeError("nvcc for sm_90 failed (nvcc -fatbin ...):\nptxas error   : too much shared data")
        return real(spec, log=log)

    monkeypatch.setattr(packager.build, "build", build)
    suite = build_bundle(tmp_path / "bundle", ["mlp", "cnn"], ["x86-64"], log=lambda m: None)
    assert [m["name"] for m in suite["models"]] == ["cnn"]
    assert suite["not_built"] == [{"name": "mlp", "error": "nvcc for sm_90 failed (nvcc -fatbin ...): "
                                                           "ptxas error   : too much shared data"}]
    assert not (tmp_path / "bundle" / "packages" / "mlp").exists()
    assert json.loads((tmp_path / "bundle" / "suite.json").read_text())["not_built"] == suite["not_built"]


def test_a_zoo_name_means_the_zoo_model_and_the_corpus_one_is_prefixed(tmp_path, monkeypatch):
    """mobilenet_v2 is in the zoo and in the corpus: the zoo model (with its PyTorch baseline) was
    silently replaced by the corpus one, so the suite lost its eager/compile columns."""
    import packager.build
    import packager.errors
    from packager.tools import gpu_suite

    asked = []

    def maker(kind):
        def make(name, tmp, targets):
            asked.append((kind, name))
            return tmp / "spec.yaml", None
        return make

    monkeypatch.setattr(gpu_suite, "_zoo_spec", maker("zoo"))
    monkeypatch.setattr(gpu_suite, "_corpus_spec", maker("corpus"))
    monkeypatch.setattr(packager.build, "build", lambda spec, log=print: (_ for _ in ()).throw(RuntimeError("no")))
    import packager.spec
    monkeypatch.setattr(packager.spec, "load_spec", lambda path: path)
    suite = gpu_suite.build_bundle(tmp_path / "b", ["mobilenet_v2", "corpus:mobilenet_v2"], ["h100"],
                                   log=lambda m: None)
    assert asked == [("zoo", "mobilenet_v2"), ("corpus", "mobilenet_v2")]
    assert [m["name"] for m in suite["not_built"]] == ["mobilenet_v2", "corpus:mobilenet_v2"]
    with pytest.raises(packager.errors.UserError, match="unknown model"):
        gpu_suite.build_bundle(tmp_path / "c", ["corpus:no_such_model"], ["h100"], log=lambda m: None)


def test_a_model_whose_export_fails_is_named_and_the_rest_travel(tmp_path, monkeypatch):
    """A corpus model's export can fail (transformers' DistilBERT under torch's exporter: aten::diff);
    that is this model's failure, not the bundle's."""
    from packager.tools import gpu_suite

    def export_fails(name, tmp, targets):
        raise RuntimeError("Exporting the operator 'aten::diff' to ONNX opset version 17 is not supported")

    monkeypatch.setattr(gpu_suite, "_corpus_spec", export_fails)
    suite = gpu_suite.build_bundle(tmp_path / "b", ["corpus:distilbert", "mlp"], ["x86-64"], log=lambda m: None)
    assert [m["name"] for m in suite["models"]] == ["mlp"]
    assert suite["not_built"][0]["name"] == "corpus:distilbert" and "aten::diff" in suite["not_built"][0]["error"]
