"""Tensor cores for fp16 matmuls on CUDA targets (a reduced-precision build: optimize/precision.py).

A kernel whose reduction multiplies fp16 operands into an fp16 or fp32 accumulator is offered to
dlight's Matmul rule first, which on sm_70+ tensorizes it with TVM's wmma intrinsics (16x16x16
fragments staged through shared memory) when every matmul extent exceeds 64. The schedule is
taken only if it is tensorized: the rule's CUDA-core fallback is what Gensor already does better.
A 3x3 conv is not a matmul to dlight (its input index is a sum of two loops), so it runs in fp16
on CUDA cores; a 1x1 conv is one. The schedule report counts the kernels on tensor cores, and a
schedule is kept only where TVM lowers it and its launch fits the block's shared memory
(_launch_shared).
"""
from __future__ import annotations

import functools
import inspect
import sys

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl

from ..measure.compile import build_with_host
from ..tir_util import gpu_kernel_fault

DYN_SMEM_TAG = "tirx.use_dyn_shared_memory"      # TVM's launch parameter for dynamic shared memory
_MMA_MARKS = ("tvm_load_matrix_sync", "tvm_mma_sync", "tvm_store_matrix_sync")


def fp16_reduction(func: tirx.PrimFunc) -> bool:
    """Whether a block of `func` reduces fp16 operands (the kernels a tensor core could take)."""
    blocks: list = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, blocks.append), order="post")
    return any(any(iv.iter_type == tirx.IterVar.CommReduce for iv in b.iter_vars)
               and any(str(r.source.dtype) == "float16" for r in b.reads) for b in blocks)


@functools.cache
def load_intrinsics() -> None:
    """Registers TVM's tensor-core intrinsics (tvm.s_tir.tensor_intrin, which dlight's rule
    imports). Its ~500 TVMScript functions are each parsed under inspect.stack(), which reads the
    source of every frame on the stack: 52 s in a fresh process, 90 s deep inside a build. The
    parser uses the frames themselves, not their source lines, for module-level functions, so
    the import runs with a stack of bare frames (8 s)."""
    real = inspect.stack

    def frames(context: int = 1) -> list[inspect.FrameInfo]:
        f, out = sys._getframe(1), []
        while f is not None:
            out.append(inspect.FrameInfo(f, f.f_code.co_filename, f.f_lineno, f.f_code.co_name, None, None))
            f = f.f_back
        return out

    inspect.stack = frames
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401  (registers the intrinsics)
    finally:
        inspect.stack = real


def uses_tensor_cores(func: tirx.PrimFunc) -> bool:
    """Whether a scheduled kernel computes with wmma fragments."""
    text = func.script()
    return all(mark in text for mark in _MMA_MARKS)


def tensor_core_matmul(func: tirx.PrimFunc, target: tvm.target.Target, shared_limit: int,
                       dynamic_limit: int) -> tirx.PrimFunc | None:
    """`func` scheduled on tensor cores, or None when it is not an fp16 matmul dlight tensorizes
    for `target`, or the result would not fit the static (`shared_limit`) or the opt-in dynamic
    shared memory of a block (`dynamic_limit`: dlight stages 72 KB, over a Turing GPU's 64)."""
    if not fp16_reduction(func):
        return None
    load_intrinsics()
    try:
        sch = dl.gpu.Matmul().apply(func.with_attr("target", target), target, False)
    except Exception:  # noqa: BLE001 - a kernel that is not a matmul raises all kinds of errors
        return None
    if not isinstance(sch, s_tir.Schedule):
        return None
    out = sch.mod["main"]
    if not uses_tensor_cores(out) or gpu_kernel_fault(out, shared_limit):
        return None
    dynamic = _launch_shared(out, target)
    if dynamic is None or dynamic > dynamic_limit:
        return None
    return out.with_attr("tirx.is_scheduled", True)


def _launch_shared(func: tirx.PrimFunc, target: tvm.target.Target) -> int | None:
    """The dynamic shared memory (bytes) of the kernel's largest launch once TVM lowers it to CUDA
    source (about 0.1 s), or None when it does not lower: dlight's rule pads a 1x1 conv it reads
    as a matmul, and on some shapes (YOLO11n's) the padded copy was read before the lowering
    defined it, which failed the whole target's code generation."""
    tgt = tvm.target.Target(target, host=tvm.target.Target({"kind": "llvm"}))
    try:
        _, host = build_with_host(
            tvm.IRModule({"main": func.with_attr("global_symbol", "main").with_attr("target", tgt)}), tgt)
    except Exception:  # noqa: BLE001 - TVM raises many error kinds from lowering/codegen
        return None
    sizes = [0]

    def visit(n) -> None:
        if isinstance(n, tvm.ir.Call) and getattr(n.op, "name", "") == "tirx.call_ffi_kernel":
            tags = [str(t) for t in n.attrs.launch_params]
            for tag, v in zip(tags, list(n.args[1:])[len(n.args) - 1 - len(tags):]):
                if tag == DYN_SMEM_TAG and isinstance(v, tvm.tirx.IntImm):
                    sizes.append(int(v.value))

    for f in host.functions.values():
        if isinstance(f, tirx.PrimFunc):
            tvm_ffi.structural_walk(f.body, (tvm.ir.Call, visit), order="pre")
    return max(sizes)
