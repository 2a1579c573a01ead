"""Kernels -> one shared object per CPU target.

TVM's LLVM backend compiles every PrimFunc into one object file for the target triple; the
target's C compiler links it with the runtime glue (error sink, barrier) into kernels.so. The
result needs only libc/libm: no libtvm, no symbols from the process that loads it.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import tvm

from .errors import InternalError
from .runtime_build import data_dir
from .targets import CpuTarget, Toolchain


def symbol_of(kernel: str) -> str:
    """The exported C symbol of a kernel built with global_symbol=kernel (TVM-FFI packed ABI)."""
    return f"__tvm_ffi_{kernel}"


def build_object(kernels: dict[str, tvm.tirx.PrimFunc], target: CpuTarget, out: Path) -> None:
    """Compile all kernels of a target into one ELF object file."""
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in kernels.items()})
    try:
        lib = tvm.tirx.build(mod, target=tvm.target.Target(target.llvm_target()))
    except Exception as e:  # noqa: BLE001 - TVM raises many error kinds from codegen
        lines = str(e).strip().splitlines()
        raise InternalError(f"code generation for target '{target.name}' failed: "
                            f"{lines[-1] if lines else type(e).__name__}") from None
    lib.write_to_file(str(out))


def run_tool(cmd: list[str], what: str) -> None:
    """Run a compiler or linker; on failure an InternalError with the end of its output."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise InternalError(f"{what} failed ({' '.join(cmd[:2])} ...):\n{(r.stdout + r.stderr).strip()[-2000:]}")


def link_kernels(obj: Path, target: CpuTarget, out: Path) -> None:
    """Link the kernels object and the glue into a self-contained kernels.so."""
    tc = Toolchain.for_arch(target.arch)
    glue_src = data_dir("runtime_cpp") / "kernel_glue" / "packrt_kernel_glue.c"
    glue_obj = obj.with_name("glue.o")
    run_tool([tc.cc, "-O2", "-fPIC", "-std=c11", "-c", str(glue_src), "-o", str(glue_obj)], "compiling the kernel glue")
    # -Bsymbolic: the kernels' hook variables bind inside the library even if the host process
    # (e.g. Python with TVM imported) defines the same names.
    run_tool([tc.cc, "-shared", "-fPIC", "-Wl,-Bsymbolic", "-Wl,-z,noexecstack", "-Wl,--no-undefined", "-s",
          "-o", str(out), str(obj), str(glue_obj), "-lm"], f"linking kernels for '{target.name}'")
    glue_obj.unlink()
