"""The CUDA toolchain comes from the package index: with no system CUDA toolkit (no nvcc or
fatbinary on PATH, no CUDA_HOME), TVM's CUDA source still compiles to a fatbin per architecture
(nvcc from the nvidia-cuda-nvcc wheel for sm_80/86/87/90, NVRTC from the CUDA 12 wheels for
sm_70), every header it includes comes from the wheels, and a missing toolchain is a one-line
error that says what to pip install."""
from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from onnx import helper
from support.cuda_tools import cuobjdump, elf_arches, ptx_arches
from support.kernel_cases import case, kernels_of, w

from packager.codegen import cuda_toolchain as tc
from packager.codegen.cuda_source import generate_cuda
from packager.errors import UserError
from packager.optimize.schedule.rules.gpu import schedule_kernels_gpu
from packager.spec import TargetSpec
from packager.targets import resolve

REPO = Path(__file__).resolve().parents[2]
NO_TOOLKIT_PATH = "/usr/bin:/bin"
TARGETS = {"a100": {}, "rtx3090": {"arch": "sm_86"}, "orin": {}, "h100": {}, "v100": {}}
# What TVM writes for float16/bfloat16 kernels (#include <cuda_fp16.h>): the float32 samples never
# include these headers, so one such kernel rides along.
HALF_KERNEL = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void __launch_bounds__(64) half_kernel(half* __restrict__ y, const half* __restrict__ x,
                                                              __nv_bfloat16* __restrict__ z) {
  int i = blockIdx.x * 64 + threadIdx.x;
  y[i] = __hfma(__float2half(2.0f), x[i], y[i]);
  z[i] = __float2bfloat16(__half2float(y[i]));
}
"""


@pytest.fixture
def no_system_toolkit(monkeypatch, tmp_path):
    """PATH without the CUDA toolkit, no CUDA_HOME/CUDA_PATH, and an empty fatbin cache."""
    monkeypatch.setenv("PATH", NO_TOOLKIT_PATH)
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDACXX", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PACKAGER_CACHE_DIR", str(tmp_path / "cache"))
    for tool in ("nvcc", "fatbinary", "ptxas", "cicc"):
        assert shutil.which(tool) is None, f"{tool} on {NO_TOOLKIT_PATH}: cannot hide the system toolkit"


@pytest.fixture(scope="module")
def sources() -> dict[str, tuple[str, str]]:
    """target -> (sm, TVM's CUDA source for a MatMul + Softmax model, plus the half kernel)."""
    model = case("MatMul", {"a": [16, 64]}, {}, {"b": w(64, 32)}, [helper.make_node("Softmax", ["y"], ["z"], axis=-1)])
    kernels = kernels_of(model)
    out = {}
    for name, fields in TARGETS.items():
        target = resolve(TargetSpec(name, fields, "test"))
        scheduled, _ = schedule_kernels_gpu(kernels, target, gensor=False)
        out[name] = (target.sm, generate_cuda(scheduled, target).source + HALF_KERNEL)
    return out


def test_pins_match_pyproject_and_the_installed_wheels():
    text = (REPO / "pyproject.toml").read_text()
    for name, version in {**tc.CUDA13_WHEELS, **tc.CUDA12_WHEELS}.items():
        assert f'"{name}=={version}"' in text, name
        assert importlib.metadata.version(name) == version, f"{name}: pip install -e '.[dev]'"


def test_nvcc_and_fatbinary_come_from_the_wheel(no_system_toolkit):
    wheel_bin = tc._wheel_bin()
    assert wheel_bin is not None, "nvidia-cuda-nvcc not installed: pip install -e ."
    assert wheel_bin.parts[-3:] == ("nvidia", "cu13", "bin")
    for tool in ("nvcc", "fatbinary"):
        assert tc._tool(tool) == str(wheel_bin / tool)
    tc.check_cuda_toolchain(70)
    r = subprocess.run([tc._tool("nvcc"), "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and "release 13.0, V13.0.88" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("target", TARGETS)
def test_fatbin_without_a_system_toolkit(no_system_toolkit, sources, target, tmp_path):
    sm, source = sources[target]
    out = tmp_path / "kernels.fatbin"
    compiler = tc.compile_fatbin(source, sm, out)
    assert compiler == ("nvrtc" if sm == "sm_70" else "nvcc")
    assert list((tmp_path / "cache" / "cuda").glob("*.fatbin")), "not compiled into the cache"
    if cuobjdump() is None:
        pytest.skip("cuobjdump not installed (pip install -e '.[dev]')")
    assert elf_arches(out) == [sm]                      # SASS for the target
    assert ptx_arches(out) == [sm]                      # and its PTX, for newer GPUs to JIT


def test_headers_come_from_the_wheels(no_system_toolkit, sources, tmp_path):
    """nvcc -M lists every file the source includes: the CUDA ones all lie in the wheels' nvidia/cu13."""
    top = tc._wheel_bin().parent
    (tmp_path / "kernels.cu").write_text(sources["h100"][1])
    r = subprocess.run([tc._tool("nvcc"), "-M", "-std=c++17", "-arch=sm_90", str(tmp_path / "kernels.cu")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    deps = [Path(p) for p in re.findall(r"(/\S+)", r.stdout.replace("\\\n", " "))]
    cuda = [p for p in deps if not p.is_relative_to(tmp_path) and not str(p).startswith(("/usr/include", "/usr/lib/gcc"))]
    assert cuda and all(p.resolve().is_relative_to(top.resolve()) for p in cuda), \
        [str(p) for p in cuda if not p.resolve().is_relative_to(top.resolve())]
    names = {p.name for p in cuda}
    assert {"cuda_runtime.h", "cuda.h", "cuda_fp16.h", "cuda_bf16.h", "host_config.h", "target"} <= names


def test_no_toolchain_is_one_line_naming_the_wheels(no_system_toolkit, monkeypatch):
    monkeypatch.setattr(tc, "_wheel_bin", lambda: None)
    with pytest.raises(UserError) as e:
        tc.check_cuda_toolchain(80)
    msg = str(e.value)
    assert "\n" not in msg and "'nvcc' not found" in msg
    assert "pip install nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88" in msg


def test_incomplete_wheels_are_one_line_naming_the_missing_one(no_system_toolkit, monkeypatch, tmp_path):
    fake = tmp_path / "cu13"
    (fake / "bin").mkdir(parents=True)
    for tool in ("nvcc", "fatbinary"):
        (fake / "bin" / tool).write_text("#!/bin/sh\n")
        (fake / "bin" / tool).chmod(0o755)
    monkeypatch.setattr(tc, "_wheel_bin", lambda: fake / "bin")
    with pytest.raises(UserError) as e:
        tc.check_cuda_toolchain(80)
    assert "\n" not in str(e.value) and "nvvm/bin/cicc (from nvidia-nvvm) is missing" in str(e.value)
    assert tc.PIP_CUDA13 in str(e.value)


def test_without_the_wheel_path_tools_are_used(no_system_toolkit, monkeypatch, tmp_path):
    for tool in ("nvcc", "fatbinary"):
        (tmp_path / tool).write_text("#!/bin/sh\n")
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setattr(tc, "_wheel_bin", lambda: None)
    monkeypatch.setenv("PATH", f"{tmp_path}:{NO_TOOLKIT_PATH}")
    assert tc._tool("nvcc") == str(tmp_path / "nvcc") and tc._tool("fatbinary") == str(tmp_path / "fatbinary")

