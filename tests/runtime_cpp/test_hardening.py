"""Hostile packages against the loader: a kernels.so swapped after its hash was checked never runs,
kernel symbols outside kernels.so are refused, the ORT op refuses a wrapper that declares another
output type, malformed .npy inputs are clean errors."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from support.packrt import X86, cli, one_line_error, run
from support.resign import resign

pytestmark = pytest.mark.slow


def test_kernels_swapped_after_the_hash_check_never_run(cnn_copy, cnn_input, tmp_path):
    """A thread keeps swapping kernels.so with a library whose constructor leaves a marker; every
    run must use the bytes that were hashed (or fail the hash check), and the marker never appear."""
    marker = tmp_path / "evil-ran"
    src = tmp_path / "evil.c"
    src.write_text('#include <stdio.h>\n__attribute__((constructor)) static void evil(void) '
                   f'{{ FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\nint packrt_kernels_abi_version(void) '
                   '{ return -1; }\n')
    evil = tmp_path / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(evil), str(src)], check=True)
    kernels = cnn_copy / "targets" / "x86-64" / "kernels.so"
    good = tmp_path / "good.so"
    shutil.copy2(kernels, good)
    stop = threading.Event()

    def swap():
        tmp = kernels.with_suffix(".swap")
        while not stop.is_set():
            for lib in (evil, good):
                shutil.copy2(lib, tmp)
                tmp.replace(kernels)        # atomic: the loader sees one whole file or the other

    t = threading.Thread(target=swap)
    t.start()
    try:
        outcomes = [run([*cli(cnn_copy), cnn_copy, "--input", f"image={cnn_input[0]}"]) for _ in range(60)]
    finally:
        stop.set()
        t.join()
    assert not marker.exists(), "a kernels.so whose hash is not in the manifest ran its constructor"
    for r in outcomes:
        assert r.returncode == 0 or ("sha256" in r.stderr or "bytes, manifest says" in r.stderr), r.stderr
    assert any(r.returncode == 0 for r in outcomes) and any(r.returncode != 0 for r in outcomes)


@pytest.mark.parametrize("symbol", ["exit", "abort", "malloc", "__tvm_ffi_no_such_kernel",
                                    "packrt_kernels_abi_version", "__TVMBackendAllocWorkspace"])
def test_kernel_symbols_must_be_kernels_defined_in_the_library(cnn_copy, cnn_input, symbol):
    plan = cnn_copy / "targets" / "x86-64" / "plan.json"
    p = json.loads(plan.read_text())
    p["kernels"][0]["symbol"] = symbol
    plan.write_text(json.dumps(p))
    resign(cnn_copy, "targets/x86-64/plan.json")
    one_line_error(run([*cli(cnn_copy), cnn_copy, "--input", f"image={cnn_input[0]}"]), 2, "has no kernel function", symbol)


@pytest.mark.parametrize("field,value,needle", [
    ("offset", -64, "must be an integer"), ("offset", 2**64 - 64, "outside its"), ("bytes", 0.75, "must be an integer"),
    ("bytes", True, "must be an integer"), ("shape", [2**32, 2**32, 16], "overflows"), ("offset", 1e300, "integer"),
])
def test_tensor_fields_are_checked_integers(cnn_copy, cnn_input, field, value, needle):
    plan = cnn_copy / "targets" / "x86-64" / "plan.json"
    p = json.loads(plan.read_text())
    p["profiles"][0]["tensors"][1][field] = value
    plan.write_text(json.dumps(p))
    resign(cnn_copy, "targets/x86-64/plan.json")
    one_line_error(run([*cli(cnn_copy), cnn_copy, "--input", f"image={cnn_input[0]}"]), 2, needle)


def test_a_fifo_plan_is_refused_without_hanging(cnn_copy, cnn_input):
    import os

    plan = cnn_copy / "targets" / "x86-64" / "plan.json"
    plan.unlink()
    os.mkfifo(plan)
    one_line_error(run([*cli(cnn_copy), cnn_copy, "--input", f"image={cnn_input[0]}"]), 2, "not a regular file")


def test_truncated_kernels_are_refused_before_dlopen(cnn_copy, cnn_input):
    k = cnn_copy / "targets" / "x86-64" / "kernels.so"
    k.write_bytes(k.read_bytes()[: k.stat().st_size // 2])
    resign(cnn_copy, "targets/x86-64/kernels.so")
    one_line_error(run([*cli(cnn_copy), cnn_copy, "--input", f"image={cnn_input[0]}"]), 2, "outside the file")


@pytest.mark.parametrize("header", ["(-1, 3)", "(99999999999, 99999999999)", "(abc)", "(2,"])
def test_malformed_npy_inputs_are_one_line_errors(cnn_copy, tmp_path, header):
    f = tmp_path / "bad.npy"
    body = "{'descr': '<f4', 'fortran_order': False, 'shape': " + header + ", }"
    body += " " * ((64 - (10 + len(body) + 1) % 64) % 64) + "\n"
    f.write_bytes(b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body.encode() + b"\0" * 16)
    one_line_error(run([*cli(cnn_copy), cnn_copy, "--input", f"image={f}"]), 2)


def test_ort_op_refuses_a_wrapper_declaring_another_output_type(cnn_copy):
    wrapper = cnn_copy / "ort" / "model.onnx"
    m = onnx.load(str(wrapper))
    m.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    for vi in m.graph.value_info:
        if vi.name == m.graph.output[0].name:
            vi.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    onnx.save(m, str(wrapper))
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(cnn_copy / "ort" / X86 / "libpackager_ort.so"))
    with pytest.raises(Exception) as e:
        s = ort.InferenceSession(str(wrapper), so, providers=["CPUExecutionProvider"])
        s.run(None, {s.get_inputs()[0].name: np.zeros([d if isinstance(d, int) else 1 for d in s.get_inputs()[0].shape],
                                                       np.float32)})
    assert m.graph.output[0].name in str(e.value) and "type" in str(e.value)


def test_expect_sha256_pins_the_package(cnn_copy, cnn_input):
    image = f"image={cnn_input[0]}"
    sha = hashlib.sha256((cnn_copy / "manifest.json").read_bytes()).hexdigest()
    info = run([*cli(cnn_copy), cnn_copy, "--info"])
    assert f"manifest sha256: {sha}" in info.stdout, info.stdout
    ok = run([*cli(cnn_copy), cnn_copy, "--input", image, "--iters", "1", "--expect-sha256", sha.upper()])
    assert ok.returncode == 0, ok.stderr
    other = sha[:-1] + ("0" if sha[-1] != "0" else "1")
    one_line_error(run([*cli(cnn_copy), cnn_copy, "--input", image, "--expect-sha256", other]), 2,
                   "not the pinned", "not the package that was expected")
    one_line_error(run([*cli(cnn_copy), cnn_copy, "--expect-sha256", "abc"]), 2, "is not 64 hex digits")
    one_line_error(run([*cli(cnn_copy), cnn_copy, "--input", image, "--expect-sha256", ""]), 2, "is not 64 hex digits")
    one_line_error(run([*cli(cnn_copy), cnn_copy, "--expect-sha256", sha, "--no-verify"]), 2, "excludes")


def test_a_pin_covers_the_files_the_manifest_lists(cnn_copy, cnn_input):
    """The pin is on manifest.json; a same-size change to a file it lists (caught only by the
    file's hash, which --no-verify skips) is refused under the pin."""
    sha = hashlib.sha256((cnn_copy / "manifest.json").read_bytes()).hexdigest()
    w = cnn_copy / "targets" / "x86-64" / "weights.bin"
    data = bytearray(w.read_bytes())
    data[0] ^= 1
    w.write_bytes(bytes(data))
    r = run([*cli(cnn_copy), cnn_copy, "--input", f"image={cnn_input[0]}", "--iters", "1", "--no-verify"])
    assert r.returncode == 0, r.stderr                       # sizes only: runs
    one_line_error(run([*cli(cnn_copy), cnn_copy, "--input", f"image={cnn_input[0]}", "--expect-sha256", sha]), 2,
                   "weights.bin")


def test_outputs_that_cannot_be_written_fail_before_the_run(cnn_copy, cnn_input, tmp_path):
    image = f"image={cnn_input[0]}"
    (tmp_path / "a_file").write_text("x")
    one_line_error(run([*cli(cnn_copy), cnn_copy, "--input", image, "-o", tmp_path / "a_file"]), 2,
                   "--output-dir", "exists and is not a folder")
    one_line_error(run([*cli(cnn_copy), cnn_copy, "--input", image, "--json", tmp_path / "no" / "such" / "r.json"]), 2,
                   "--json", "cannot write it")
    assert (tmp_path / "a_file").read_text() == "x"


def test_check_refuses_edited_reference_data(cnn_copy):
    """An edited reference output is a changed package, not the kernels computing wrong answers."""
    ref = json.loads((cnn_copy / "reference" / "reference.json").read_text())
    out = cnn_copy / ref["profiles"][0]["outputs"]["logits"]
    a = np.load(out)
    a.flat[0] += 1
    np.save(out, a)
    one_line_error(run([*cli(cnn_copy), cnn_copy, "--check"]), 2, "is not the file the package was built with",
                   "reference data was changed")
    r = run([*cli(cnn_copy), cnn_copy, "--check", "--no-verify"])         # unchecked: reported as a mismatch
    assert r.returncode == 1 and "MISMATCH" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("args, needle", [(["--threads", "-1"], "--threads"), (["--threads", "5000"], "0 to 1024"),
                                          (["--threads", "many"], "--threads"), (["--iters", "0"], "--iters"),
                                          (["--bogus"], "bogus")])
def test_option_errors_are_one_line(cnn_copy, args, needle):
    one_line_error(run([*cli(cnn_copy), cnn_copy, *args]), 2, needle)
