"""Kernels -> CUDA C source and launch metadata per CUDA target, with no GPU.

TVM lowers the thread-bound PrimFuncs into a host function (which launches the device kernels)
and device kernels (CUDA C). The host function is never compiled: just before TVM turns it into
its packed-call form, we read every kernel launch from it (kernel name, the PrimFunc parameter
behind each pointer argument, grid/block extents, dynamic shared memory), and the C++ runtime
replays those launches from the plan. TVM orders a kernel's parameters by name, not by the
PrimFunc's order, so every launch carries its argument map. cuda_toolchain.py compiles the source.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import expr as ir

from ..errors import InternalError, UserError
from ..optimize.schedule.measure.compile import build_with_host
from ..targets import Target

LAUNCH_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
DYN_SMEM_TAG = "tirx.use_dyn_shared_memory"


@dataclass
class Launch:
    """One device-kernel launch of a PrimFunc: args[i] is the PrimFunc parameter index of the
    kernel's i-th pointer, or -(k+1) for workspace buffer k."""

    function: str
    args: list[int]
    grid: list[int]
    block: list[int]
    shared_bytes: int = 0
    cooperative: bool = False      # a grid-synchronized kernel (cuda_grid.py): every block co-resident

    def as_dict(self) -> dict:
        return {"function": self.function, "args": self.args, "grid": self.grid, "block": self.block,
                "shared_bytes": self.shared_bytes, "cooperative": self.cooperative}


@dataclass
class CudaKernel:
    launches: list[Launch] = field(default_factory=list)
    workspace: list[int] = field(default_factory=list)      # bytes of each global scratch buffer


@dataclass
class CudaModule:
    source: str
    kernels: dict[str, CudaKernel]


def _int(e, what: str) -> int:
    if not isinstance(e, tirx.IntImm):
        raise InternalError(f"{what} is {e}, not a constant: only static shapes can be compiled ahead of time")
    return int(e.value)


def _host_launches(name: str, f: tvm.tirx.PrimFunc) -> CudaKernel:
    """Read the launches (and global scratch buffers) from a host function before MakePackedAPI."""
    params = list(f.params)
    origin: dict = {}                   # buffer var -> parameter index (>= 0) or workspace (< 0)
    out = CudaKernel()
    unsupported: list[str] = []

    def resolve(v) -> int:
        for i, p in enumerate(params):
            if v.same_as(p):
                return i
        for var, idx in origin.items():
            if v.same_as(var):
                return idx
        raise InternalError(f"kernel '{name}': launch argument {v} is neither a parameter nor a scratch buffer")

    def buffer_of(e):
        if isinstance(e, ir.Call) and getattr(e.op, "name", "") == "tirx.buffer_data":
            return e.args[0]
        return None

    def visit(n):
        if isinstance(n, tirx.DeclBuffer):
            src = buffer_of(n.data) if n.data is not None else None
            if src is not None:
                origin[n.buffer] = resolve(src)
        elif isinstance(n, tirx.AllocBuffer):
            buf = n.buffer
            dtype = tvm.runtime.DataType(str(buf.dtype))
            nbytes = (dtype.bits * dtype.lanes + 7) // 8
            for d in buf.shape:
                nbytes *= _int(d, f"kernel '{name}': scratch buffer size")
            out.workspace.append(nbytes)
            origin[n.buffer] = -len(out.workspace)
        elif isinstance(n, ir.Call) and getattr(n.op, "name", "") == "tirx.call_ffi_kernel":
            tags = [str(t) for t in n.attrs.launch_params]
            args = list(n.args[1:])
            n_ptr = len(args) - len(tags)
            ptrs, values = args[:n_ptr], args[n_ptr:]
            refs = []
            for a in ptrs:
                b = buffer_of(a)
                if b is None:
                    raise InternalError(f"kernel '{name}': launch argument {a} is not a buffer pointer "
                                        "(scalar kernel arguments are not supported)")
                refs.append(resolve(b))
            ext = {}
            for tag, v in zip(tags, values):
                if tag not in LAUNCH_TAGS and tag != DYN_SMEM_TAG:
                    raise InternalError(f"kernel '{name}': unsupported launch parameter {tag}")
                ext[tag] = _int(v, f"kernel '{name}': launch extent {tag}")
            out.launches.append(Launch(str(n.args[0].value), refs,
                                       [ext.get(f"blockIdx.{c}", 1) for c in "xyz"],
                                       [ext.get(f"threadIdx.{c}", 1) for c in "xyz"], ext.get(DYN_SMEM_TAG, 0)))
        elif isinstance(n, ir.Call) and getattr(n.op, "name", "") in ("tirx.call_packed", "tirx.call_extern"):
            unsupported.append(str(n.args[0]))
        elif isinstance(n, tirx.BufferStore):
            raise InternalError(f"kernel '{name}' stores to '{n.buffer.name}' in host code: a block was left "
                                "without a GPU thread binding")

    tvm_ffi.structural_walk(f.body, ((tirx.DeclBuffer, tirx.AllocBuffer, ir.Call, tirx.BufferStore), visit),
                            order="pre")
    if unsupported:
        raise UserError(f"kernel '{name}' calls {', '.join(unsupported)} on the host, which a GPU package cannot "
                        "do; build it for a CPU target or keep this operator in ONNX Runtime")
    if not out.launches:
        raise InternalError(f"kernel '{name}' launches no device kernel")
    return out


def generate_cuda(kernels: dict[str, tvm.tirx.PrimFunc], target: Target) -> CudaModule:
    """CUDA C source of all kernels of one target, and each PrimFunc's launches."""
    return device_module(kernels, tvm.target.Target(target.tvm_target()), f"target '{target.name}'")


def device_module(kernels: dict[str, tvm.tirx.PrimFunc], device: tvm.target.Target, what: str,
                  retarget: bool = False) -> CudaModule:
    """Device source of thread-bound kernels lowered for `device`, and each PrimFunc's launches,
    read from the host function. `retarget`: lower every kernel for `device`, also those whose
    schedule bound them to another target (dlight records the target it scheduled for)."""
    if not kernels:                              # a part of only copies (partial offload) has none
        return CudaModule("", {})
    tgt = tvm.target.Target(device, host=tvm.target.Target({"kind": "llvm"}))
    mod = tvm.IRModule({n: f.with_attr("global_symbol", n).with_attr("target", tgt) if retarget
                        else f.with_attr("global_symbol", n) for n, f in kernels.items()})
    try:
        lib, host = build_with_host(mod, tgt)
    except Exception as e:  # noqa: BLE001 - TVM raises many error kinds from lowering/codegen
        lines = str(e).strip().splitlines()
        raise InternalError(f"{device.kind.name} code generation for {what} failed: "
                            f"{lines[-1] if lines else type(e).__name__}") from None
    launches = {gv.name_hint: _host_launches(gv.name_hint, f) for gv, f in host.functions_items()
                if gv.name_hint in kernels}
    missing = set(kernels) - set(launches)
    if missing:
        raise InternalError(f"no host function found for kernel(s) {', '.join(sorted(missing))}")
    return CudaModule(lib.imports[0].inspect_source(), launches)
