"""A CUDA target's scheduled kernels again as OpenCL C, so `pack verify --gpu-emulate` can run
them on the CPU (PoCL) where no GPU is at hand.

The kernels are the same scheduled PrimFuncs the CUDA target compiles: same thread blocks, tile
bounds, shared-memory staging and barriers; only TVM's last lowering steps differ by language.
What OpenCL C cannot say the same way is recorded per kernel: a cooperative (grid-synchronized)
kernel runs as one launch per phase, which is what a grid barrier means; a cross-thread
reduction that CUDA lowers with warp shuffles is lowered through local memory; a kernel that
OpenCL codegen refuses (tensor-core intrinsics, say) is not emulated, with the reason. The
package keeps `emulation/kernels.cl` and `emulation/emulation.json` (its launches, per kernel)
beside the fatbin; the tool that reads them is packager/tools/emulate.py.
"""
from __future__ import annotations

import re

import tvm

from ..errors import InternalError
from .cuda_grid import kernel_definitions
from .cuda_source import CudaKernel, CudaModule, Launch, device_module

EMULATION_FORMAT, EMULATION_VERSION = "packager-emulation", 1
SHUFFLE = re.compile(r"__shfl\w*\(")


def opencl_emulation(kernels: dict[str, tvm.tirx.PrimFunc], cuda: CudaModule, cooperative: set[str],
                     what: str) -> tuple[str, dict]:
    """OpenCL C for `kernels` (lowered as they were scheduled for CUDA) and emulation.json's
    document: per kernel, whether it is emulated, its OpenCL launches and what differs from CUDA.
    `cuda`: the CUDA module before its phased kernels were joined; `cooperative`: those joined."""
    module, refused = _opencl_module(kernels, what)
    shuffles = _functions_with_shuffles(cuda.source)
    doc: dict = {"format": EMULATION_FORMAT, "version": EMULATION_VERSION, "language": "OpenCL C",
                 "kernels": {}}
    for name in kernels:
        if name in refused:
            doc["kernels"][name] = {"emulated": False, "reason": refused[name]}
            continue
        k = module.kernels[name]
        doc["kernels"][name] = {"emulated": True, "launches": [ln.as_dict() for ln in k.launches],
                                "workspace": k.workspace,
                                "differences": _differences(name, k, cuda.kernels[name].launches,
                                                            name in cooperative, shuffles)}
    return (module.source if module.kernels else ""), doc


def _opencl_module(kernels: dict[str, tvm.tirx.PrimFunc], what: str) -> tuple[CudaModule, dict[str, str]]:
    """All kernels as one OpenCL module; when that fails, each kernel alone, so the ones OpenCL
    codegen refuses are named (with TVM's reason) and the rest still emulated."""
    device = tvm.target.Target({"kind": "opencl"})
    try:
        return device_module(kernels, device, what, retarget=True), {}
    except InternalError:
        pass
    refused = {}
    for name in kernels:
        try:
            device_module({name: kernels[name]}, device, what, retarget=True)
        except InternalError as e:
            refused[name] = str(e)
    kept = {n: f for n, f in kernels.items() if n not in refused}
    return (device_module(kept, device, what, retarget=True) if kept else CudaModule("", {})), refused


def _functions_with_shuffles(source: str) -> set[str]:
    """The CUDA functions whose bodies use warp shuffles."""
    return {name for name, (_, body) in kernel_definitions(source).items() if SHUFFLE.search(body)}


def _differences(name: str, k: CudaKernel, cuda: list[Launch], cooperative: bool, shuffles: set[str]) -> list[str]:
    """What the OpenCL run of a kernel does not check of its CUDA form (`cuda`: its launches
    before phases were joined)."""
    notes = []
    if cooperative:
        notes.append(f"grid barrier: its {len(k.launches)} phases run as {len(k.launches)} launches "
                     "(the cooperative wrapper and its grid-stride loops are not run)")
    if [(ln.grid, ln.block) for ln in k.launches] != [(ln.grid, ln.block) for ln in cuda]:
        notes.append("launch shapes differ from CUDA's: " + ", ".join(
            f"{'x'.join(map(str, ln.grid))}/{'x'.join(map(str, ln.block))}" for ln in cuda))
    if any(ln.function in shuffles for ln in cuda):
        notes.append("warp-shuffle reduction: lowered through local memory, not shuffles")
    return notes
