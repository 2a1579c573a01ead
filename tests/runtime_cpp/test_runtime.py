"""The C++ runtime without Python: packrt-run, the C API, the example, linkage, load-time checks."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from support.helpers import HAS_QEMU, REPO, ort_run
from support.packrt import X86, cli, one_line_error, run

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("arch", [X86, "aarch64"])
def test_packrt_run_reproduces_onnxruntime(packages, cnn_input, tmp_path, arch):
    if arch != X86 and not HAS_QEMU:
        pytest.skip("qemu-aarch64 not installed")
    pkg = packages["cnn"]
    path, x = cnn_input
    target = "x86-64" if arch == X86 else "arm64"
    r = run([*cli(pkg, arch), pkg, "--target", target, "--input", f"image={path}", "--output-dir", tmp_path,
             "--iters", "3", "--threads", "2", "--json", tmp_path / "stats.json"])
    assert r.returncode == 0, r.stderr
    assert "latency over 3 runs" in r.stdout
    ours = np.load(tmp_path / "logits.npy")
    ref = ort_run(Path(json.loads((pkg / "manifest.json").read_text())["source_model"]["path"]), {"image": x})["logits"]
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["target"] == target and len(stats["latency_ms"]) == 3 and stats["threads"] == 2


def test_packrt_run_info_and_profile(packages, tmp_path):
    pkg = packages["mlp"]
    r = run([*cli(pkg), pkg, "--info"])
    assert r.returncode == 0, r.stderr
    assert "profile default" in r.stdout and "profile batch16" in r.stdout
    assert "input  features: float32 [16, 256]" in r.stdout
    x = np.ones((16, 256), np.float32)
    p = tmp_path / "features16.npy"
    np.save(p, x)
    r = run([*cli(pkg), pkg, "--input", p, "--profile", "--iters", "2"])
    assert r.returncode == 0, r.stderr
    assert "per-step time (profile batch16" in r.stdout and "fused_matmul" in r.stdout


def test_wrong_input_shape_dtype_name_and_missing_inputs(packages, tmp_path):
    pkg = packages["cnn"]
    np.save(tmp_path / "small.npy", np.zeros((1, 3, 32, 32), np.float32))
    np.save(tmp_path / "f64.npy", np.zeros((1, 3, 64, 64), np.float64))
    one_line_error(run([*cli(pkg), pkg, "--input", f"image={tmp_path / 'small.npy'}"]), 2,
                   "image[1,3,32,32] match no profile", "default (image[1,3,64,64])")
    one_line_error(run([*cli(pkg), pkg, "--input", f"image={tmp_path / 'f64.npy'}"]), 2,
                   "'image' has dtype float64, the model expects float32")
    one_line_error(run([*cli(pkg), pkg, "--input", f"img={tmp_path / 'small.npy'}"]), 2, "no input named 'img'")
    one_line_error(run([*cli(pkg), pkg]), 2, "no inputs given", "--input image=FILE.npy")
    one_line_error(run([*cli(pkg), pkg, "--input", f"image={tmp_path / 'nope.npy'}"]), 2, "cannot open .npy")
    one_line_error(run([*cli(pkg), tmp_path / "nope"]), 2, "package folder not found")


def test_tampered_and_truncated_files_are_refused_at_load(cnn_copy, cnn_input):
    w = cnn_copy / "targets" / "x86-64" / "weights.bin"
    original = w.read_bytes()
    data = bytearray(original)
    data[100] ^= 0x40
    w.write_bytes(bytes(data))
    args = [*cli(cnn_copy), cnn_copy, "--input", f"image={cnn_input[0]}"]
    one_line_error(run(args), 2, "targets/x86-64/weights.bin", "fails its sha256 check")
    # --no-verify skips the hash but never the size check
    w.write_bytes(original[:-8])
    one_line_error(run([*args, "--no-verify"]), 2, "weights.bin", "bytes, manifest says", "truncated")
    w.write_bytes(original)
    k = cnn_copy / "targets" / "x86-64" / "kernels.so"
    kd = bytearray(k.read_bytes())
    kd[-1] ^= 1
    k.write_bytes(bytes(kd))
    one_line_error(run(args), 2, "kernels.so", "sha256")


def test_paths_outside_the_package_are_refused(cnn_copy, cnn_input, tmp_path):
    m = json.loads((cnn_copy / "manifest.json").read_text())
    args = [*cli(cnn_copy), cnn_copy, "--input", f"image={cnn_input[0]}"]
    # a manifest entry that climbs out of the package
    m2 = json.loads(json.dumps(m))
    m2["targets"][0]["plan"] = "../outside/plan.json"
    m2["files"]["../outside/plan.json"] = {"sha256": "0" * 64, "bytes": 1}
    (cnn_copy / "manifest.json").write_text(json.dumps(m2))
    one_line_error(run(args), 2, "outside the package")
    # a symlink inside the package that points outside it
    (cnn_copy / "manifest.json").write_text(json.dumps(m))
    plan = cnn_copy / "targets" / "x86-64" / "plan.json"
    outside = tmp_path / "plan.json"
    shutil.move(plan, outside)
    os.symlink(outside, plan)
    one_line_error(run(args), 2, "symlink")


def test_no_target_for_this_cpu(packages, cnn_input):
    pkg = packages["cnn"]
    one_line_error(run([*cli(pkg), pkg, "--target", "arm64", "--input", f"image={cnn_input[0]}"]), 2,
                   "target 'arm64' is built for aarch64, this machine is x86_64")


def test_runtime_refuses_packages_without_a_runnable_target(cnn_copy, cnn_input):
    m = json.loads((cnn_copy / "manifest.json").read_text())
    m["targets"] = [t for t in m["targets"] if t["name"] == "x86-64"]
    m["targets"][0]["cpu_features"] = ["avx512f", "imaginary_feature"]
    (cnn_copy / "manifest.json").write_text(json.dumps(m))
    one_line_error(run([*cli(cnn_copy), cnn_copy, "--input", f"image={cnn_input[0]}"]), 2,
                   "no target in package 'cnn' runs on this machine", "imaginary_feature")


def readelf_needed(path: Path) -> set[str]:
    out = run(["readelf", "-d", path]).stdout
    return {line.split("[")[1].split("]")[0] for line in out.splitlines() if "(NEEDED)" in line}


@pytest.mark.parametrize("arch", [X86, "aarch64"])
def test_binaries_link_only_the_runtime(packages, arch):
    pkg = packages["cnn"]
    rt = pkg / "runtime" / arch
    target = "x86-64" if arch == X86 else "arm64"
    system = {"libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}
    assert readelf_needed(rt / "bin" / "packrt-run") <= system           # libstdc++ is linked statically
    assert readelf_needed(rt / "lib" / "libpackrt.so") <= system
    assert readelf_needed(rt / "bin" / "packrt-example") <= system | {"libpackrt.so"}
    assert readelf_needed(pkg / "targets" / target / "kernels.so") <= system
    for f in [rt / "bin" / "packrt-run", rt / "lib" / "libpackrt.so", pkg / "targets" / target / "kernels.so"]:
        needed = " ".join(readelf_needed(f))
        assert "tvm" not in needed and "python" not in needed
    if arch == X86:
        ldd = run(["ldd", rt / "bin" / "packrt-example"]).stdout
        assert "libpackrt.so" in ldd and "not found" not in ldd and "tvm" not in ldd and "python" not in ldd


@pytest.mark.parametrize("arch", [X86, "aarch64"])
def test_cpp_example_reproduces_outputs(packages, cnn_input, tmp_path, arch):
    if arch != X86 and not HAS_QEMU:
        pytest.skip("qemu-aarch64 not installed")
    pkg = packages["cnn"]
    exe = pkg / "runtime" / arch / "bin" / "packrt-example"
    prefix = [] if arch == X86 else ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]
    r = run([*prefix, exe, pkg, tmp_path, cnn_input[0]])
    assert r.returncode == 0, r.stderr
    ref = ort_run(Path(json.loads((pkg / "manifest.json").read_text())["source_model"]["path"]),
                  {"image": cnn_input[1]})["logits"]
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", [X86, "aarch64"])
def test_cmake_find_package_builds_the_shipped_example(packages, cnn_input, tmp_path, arch):
    """A C++ project on a package's runtime: find_package(packrt CONFIG REQUIRED) + packrt::packrt,
    the example project shipped in runtime/<arch>/share/packrt/example, built out of the package."""
    if arch != X86 and not HAS_QEMU:
        pytest.skip("qemu-aarch64 not installed")
    pkg = packages["cnn"]
    rt = pkg / "runtime" / arch
    project = rt / "share" / "packrt" / "example"
    assert "find_package(packrt CONFIG REQUIRED)" in (project / "CMakeLists.txt").read_text()
    cfg = ["cmake", "-S", project, "-B", tmp_path / "build", f"-DCMAKE_PREFIX_PATH={rt}"]
    if arch != X86:
        cfg.append(f"-DCMAKE_TOOLCHAIN_FILE={pkg / 'runtime' / 'src' / 'cmake' / 'aarch64-linux-gnu.cmake'}")
    for cmd in (cfg, ["cmake", "--build", tmp_path / "build"]):
        r = run(cmd)
        assert r.returncode == 0, r.stdout + r.stderr
    prefix = [] if arch == X86 else ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]
    r = run([*prefix, tmp_path / "build" / "run_model", pkg, tmp_path, cnn_input[0]])
    assert r.returncode == 0, r.stderr
    ref = ort_run(Path(json.loads((pkg / "manifest.json").read_text())["source_model"]["path"]),
                  {"image": cnn_input[1]})["logits"]
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), ref, rtol=1e-4, atol=1e-5)


def test_runtime_sizes_are_small_and_shown_by_inspect(packages):
    """Stripped, section-collected release builds: libpackrt.so < 1 MB, packrt-run < 1.5 MB (x86_64)."""
    rt = packages["cnn"] / "runtime" / X86
    assert (rt / "lib" / "libpackrt.so").stat().st_size < 1_000_000
    assert (rt / "bin" / "packrt-run").stat().st_size < 1_500_000
    r = run(["pack", "inspect", packages["cnn"]])
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith(f"  runtime {X86}:"))
    assert "libpackrt.so 0." in line and ("packrt-run 0." in line or "packrt-run 1." in line), line


def test_c_api(packages, cnn_input, tmp_path):
    pkg = packages["cnn"]
    rt = pkg / "runtime" / X86
    exe = tmp_path / "c_api_test"
    r = run(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-o", exe, HERE / "c_api_test.c",
             f"-I{rt / 'include'}", f"-L{rt / 'lib'}", "-lpackrt", "-lpthread", f"-Wl,-rpath,{rt / 'lib'}"])
    assert r.returncode == 0, r.stderr
    cnn_input[1].tofile(tmp_path / "in.raw")
    r = run([exe, pkg, tmp_path / "in.raw", tmp_path / "out.raw"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ALL OK" in r.stdout
    ours = np.fromfile(tmp_path / "out.raw", np.float32).reshape(1, 10)
    ref = ort_run(Path(json.loads((pkg / "manifest.json").read_text())["source_model"]["path"]),
                  {"image": cnn_input[1]})["logits"]
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)


def test_sha256_matches_hashlib(tmp_path):
    src = REPO / "runtime_cpp" / "src"
    harness = tmp_path / "sha.cpp"
    harness.write_text('#include "sha256.h"\n#include <cstdio>\n#include <vector>\n'
                       "int main(int, char** argv) { std::FILE* f = std::fopen(argv[1], \"rb\");\n"
                       "  std::vector<char> b(1 << 20); packrt::Sha256 h; size_t n;\n"
                       "  while ((n = std::fread(b.data(), 1, 777, f)) > 0) h.update(b.data(), n);\n"
                       "  std::printf(\"%s\\n\", h.hex().c_str()); }\n")
    exe = tmp_path / "sha"
    r = run(["g++", "-std=c++17", "-O2", f"-I{src}", "-o", exe, harness, src / "sha256.cpp"])
    assert r.returncode == 0, r.stderr
    rng = np.random.default_rng(0)
    for n in [0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 1 << 20]:
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        (tmp_path / "blob").write_bytes(data)
        assert run([exe, tmp_path / "blob"]).stdout.strip() == hashlib.sha256(data).hexdigest(), n


def test_runtime_rebuilds_from_package_sources(packages, cnn_input, tmp_path):
    """The package's runtime/src is complete: a user can rebuild packrt-run on the device."""
    pkg = packages["cnn"]
    build = tmp_path / "build"
    r = run(["cmake", "-S", pkg / "runtime" / "src", "-B", build, "-DCMAKE_BUILD_TYPE=Release",
             "-DPACKRT_BUILD_EXAMPLES=OFF"])
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(["cmake", "--build", build, "-j", "2", "--target", "packrt-run"])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = tmp_path / "not" / "yet" / "there"                 # --output-dir is created like `mkdir -p`
    r = run([build / "packrt-run", pkg, "--input", f"image={cnn_input[0]}", "--output-dir", out])
    assert r.returncode == 0, r.stderr
    assert np.load(out / "logits.npy").shape == (1, 10)
