"""The OpenCL form of a CUDA target's kernels (codegen/opencl.py): the same scheduled PrimFuncs
lowered for OpenCL, with launches read the same way; a phased kernel keeps one launch per phase;
a kernel OpenCL codegen refuses is named with the reason while the others stay emulated."""
from __future__ import annotations

import pytest

from packager.codegen import opencl
from packager.codegen.cuda_source import generate_cuda
from packager.errors import InternalError
from packager.optimize.schedule.rules.gpu import schedule_kernels_gpu
from packager.spec import TargetSpec
from packager.targets import resolve
from support.kernel_cases import case, kernels_of, phased_matmuls, w


@pytest.fixture(scope="module")
def scheduled():
    h100 = resolve(TargetSpec("h100", {}, "test"))
    kernels = {"chain": phased_matmuls(), **kernels_of(case("MatMul", {"x": [1, 37, 96]}, inits={"b": w(96, 53)}))}
    out, _ = schedule_kernels_gpu(kernels, h100)
    return out, generate_cuda(out, h100)


def test_every_kernel_is_emulated_with_the_cuda_launch_shapes(scheduled):
    kernels, cuda = scheduled
    source, doc = opencl.opencl_emulation(kernels, cuda, set(), "test")
    assert doc["format"] == opencl.EMULATION_FORMAT
    assert "__kernel void" in source and "__global__" not in source
    for name, k in doc["kernels"].items():
        assert k["emulated"], name
        assert [(ln["grid"], ln["block"]) for ln in k["launches"]] == [
            (ln.grid, ln.block) for ln in cuda.kernels[name].launches]
        assert k["workspace"] == cuda.kernels[name].workspace
        for ln in k["launches"]:
            assert f"__kernel void {ln['function']}(" in source


def test_a_joined_kernel_runs_one_launch_per_phase(scheduled):
    kernels, cuda = scheduled
    _, doc = opencl.opencl_emulation(kernels, cuda, {"chain"}, "test")
    chain = doc["kernels"]["chain"]
    assert len(chain["launches"]) == 2
    assert chain["differences"][0].startswith("grid barrier: its 2 phases run as 2 launches")


def test_a_kernel_opencl_refuses_is_named_and_the_rest_still_emulated(scheduled, monkeypatch):
    kernels, cuda = scheduled
    real = opencl.device_module

    def refuse_chain(ks, device, what, retarget=False):
        if "chain" in ks:
            raise InternalError("opencl code generation for test failed: no OpenCL form of a tensor-core intrinsic")
        return real(ks, device, what, retarget)

    monkeypatch.setattr(opencl, "device_module", refuse_chain)
    source, doc = opencl.opencl_emulation(kernels, cuda, set(), "test")
    assert doc["kernels"]["chain"] == {"emulated": False,
                                      "reason": "opencl code generation for test failed: no OpenCL form of a "
                                                "tensor-core intrinsic"}
    others = [k for n, k in doc["kernels"].items() if n != "chain"]
    assert others and all(k["emulated"] for k in others)
    assert "chain_kernel" not in source


def test_warp_shuffles_in_the_cuda_source_are_named_as_a_difference():
    cuda_source = ('extern "C" __global__ void __launch_bounds__(32) k_kernel(float* a) {\n'
                   '  t = __shfl_down_sync(mask, red, 16, 32);\n}\n'
                   'extern "C" __global__ void __launch_bounds__(32) j_kernel(float* a) {\n  a[0] = 1;\n}\n')
    assert opencl._functions_with_shuffles(cuda_source) == {"k_kernel"}


def test_a_unit_without_kernels_has_empty_sources():
    """A compiled part of only copies (SLANet's partial offload) has no kernels: its CUDA target
    failed with 'Index out of range' in TVM's module list."""
    h100 = resolve(TargetSpec("h100", {}, "test"))
    cuda = generate_cuda({}, h100)
    assert cuda.source == "" and cuda.kernels == {}
    source, doc = opencl.opencl_emulation({}, cuda, set(), "test")
    assert source == "" and doc["kernels"] == {}
