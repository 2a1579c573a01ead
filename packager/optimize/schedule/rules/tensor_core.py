"""Tensor cores for fp16 matmuls on CUDA targets (a reduced-precision build: optimize/precision.py).

A kernel whose reduction multiplies fp16 operands into an fp32 accumulator is a matmul for the
tensor cores on sm_70+ when M and N hold at least one 16x16x16 wmma fragment and K two. wmma.py
schedules it with a block tile sized to the matmul and the target's SM count (dlight's rule had one
128x128 tile for every shape, one block for a batch-1 transformer's matmuls); the schedule is taken
only if it is tensorized, else Gensor schedules the kernel on CUDA cores.
Convs are matmuls too: dlight's index maps read a conv's padded input as an implicit im2col (a
3x3 conv of 64 channels on a 56x56 map is M = 3136, N = 64, K = 576), which the tile's shared
memory loads gather; a depthwise conv is not a matmul. The schedule report counts the kernels on tensor cores, and a
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
from tvm.s_tir.dlight.gpu.matmul import check_sm_version

from ..measure.compile import build_with_host
from ..tir_util import gpu_kernel_fault, unbound_blocks
from .wmma import FRAG, STAGING, WmmaTile, matmul_extents, tiles, wmma_schedule

DYN_SMEM_TAG = "tirx.use_dyn_shared_memory"      # TVM's launch parameter for dynamic shared memory
_MMA_MARKS = ("tvm_load_matrix_sync", "tvm_mma_sync", "tvm_store_matrix_sync")
TRIES = 4                                        # tiles lowered before the kernel is left to CUDA cores


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
                       dynamic_limit: int, sms: int) -> tuple[tirx.PrimFunc, WmmaTile] | None:
    """`func` scheduled on tensor cores and the tile it got, or None when it is not an fp16 matmul
    (M and N at least one 16-wide fragment, K two) on sm_70+, or no tile lowers within the static
    (`shared_limit`) and the opt-in dynamic shared memory of a block (`dynamic_limit`). Tiles are
    tried fastest estimate first for `sms` SMs (wmma.py)."""
    if not fp16_reduction(func) or check_sm_version(str(target.attrs.get("arch", ""))) < 70:
        return None
    try:
        extents = matmul_extents(func)
    except Exception:  # noqa: BLE001 - a kernel that is not a plain matmul raises all kinds of errors
        return None
    if extents is None or min(extents[1:3]) < FRAG or extents[3] < 2 * FRAG:
        return None
    load_intrinsics()
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group

    group = get_wmma_intrin_group(load_scope="shared.dyn", store_scope=STAGING, in_dtype="float16",
                                  out_dtype="float32", trans_b=True)
    for tile in tiles(*extents, sms=sms, shared_limit=dynamic_limit)[:TRIES]:
        try:
            sch = wmma_schedule(func.with_attr("target", target), tile, group)
        except Exception:  # noqa: BLE001 - a kernel that is not a plain matmul raises all kinds of errors
            sch = None
        if sch is None:
            continue
        out = sch.mod["main"]
        if not uses_tensor_cores(out) or unbound_blocks(out) or gpu_kernel_fault(out, shared_limit):
            continue              # e.g. a folded split's block the tile leaves outside the thread bindings
        dynamic = _launch_shared(out, target)        # the opt-in limit holds dynamic and static together
        if dynamic is not None and dynamic + tile.static_bytes() <= dynamic_limit:
            return out.with_attr("tirx.is_scheduled", True), tile
    return None


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
