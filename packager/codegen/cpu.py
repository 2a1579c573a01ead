"""The CPU backend (x86-64, ARM64): kernels -> one shared object per target, run by packrt-run
natively or under qemu-user.

TVM's LLVM backend compiles the PrimFuncs into object files for the target triple (one per core
of this machine, compiled at once); the target's C compiler links them with the runtime glue
(error sink, barrier) into kernels.so. The
result needs only libc/libm: no libtvm, no symbols from the process that loads it.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from ..errors import InternalError
from ..optimize.schedule.measure.compile import build_parts
from ..targets import ARCHES, CpuTarget, Toolchain, host_arch, host_cpu_flags, host_ghz
from .backend import Compiled
from .tools import run_tool

QEMU_SYSROOT = {"aarch64": "/usr/aarch64-linux-gnu"}


def symbol_of(kernel: str) -> str:
    """The exported C symbol of a kernel built with global_symbol=kernel (TVM-FFI packed ABI)."""
    return f"__tvm_ffi_{kernel}"


_DEFINE = re.compile(r"^define [^@\n]*@([\w.$]+)\(", re.M)
_REFERENCE = re.compile(r"@([\w.$]+)")
_BARRIER = ("@__TVMBackendParallelBarrier", "@TVMBackendParallelBarrier")


def barrier_kernels(llvm_ir: str, names: list[str]) -> list[str]:
    """The kernels whose code (through the parallel lambdas they launch) calls TVM's parallel
    barrier: their tasks must all run at once, so the runtime launches them one task per thread
    instead of handing chunks to whichever thread is free. Read from the LLVM IR that TVM emitted,
    so every way TVM has of emitting a barrier is covered."""
    starts = [(m.start(), m.group(1)) for m in _DEFINE.finditer(llvm_ir)]
    bodies = {name: llvm_ir[s:e] for (s, name), (e, _) in zip(starts, starts[1:] + [(len(llvm_ir), "")])}
    refs = {name: set(_REFERENCE.findall(body)) & bodies.keys() for name, body in bodies.items()}
    calls = {name for name, body in bodies.items() if any(b in body for b in _BARRIER)}

    def reaches(fn: str) -> bool:
        seen, todo = set(), [fn]
        while todo:
            f = todo.pop()
            if f in calls:
                return True
            if f not in seen:
                seen.add(f)
                todo.extend(refs.get(f, ()))
        return False

    return [n for n in names if reaches(symbol_of(n))]


def build_objects(kernels: dict, target: CpuTarget, out: Path) -> tuple[list[Path], list[str]]:
    """Compile all kernels of a target into ELF object files, one per core of this machine (each
    compiled on its own thread, measure/compile.py), named after `out`; returns the files and the
    kernels that call the parallel barrier."""
    import tvm

    def write(lib, i: int, names: list[str]) -> tuple[Path, list[str]]:
        path = out.with_name(f"{out.stem}{i}{out.suffix}")
        lib.write_to_file(str(path))
        return path, barrier_kernels(lib.inspect_source("ll"), names)     # helper names repeat across parts

    try:
        parts = build_parts(kernels, tvm.target.Target(target.llvm_target()), write)
    except Exception as e:  # noqa: BLE001 - TVM raises many error kinds from codegen
        lines = str(e).strip().splitlines()
        raise InternalError(f"code generation for target '{target.name}' failed: "
                            f"{lines[-1] if lines else type(e).__name__}") from None
    together = {k for _, (_, ks) in parts for k in ks}
    return [path for _, (path, _) in parts], [k for k in kernels if k in together]


def link_kernels(objs: list[Path], target: CpuTarget, out: Path) -> None:
    """Link the kernels' objects and the glue into a self-contained kernels.so."""
    from ..emit.runtime import data_dir

    tc = Toolchain.for_arch(target.arch)
    glue_src = data_dir("runtime_cpp") / "kernel_glue" / "packrt_kernel_glue.c"
    glue_obj = objs[0].with_name("glue.o")
    run_tool([tc.cc, "-O2", "-fPIC", "-std=c11", "-c", str(glue_src), "-o", str(glue_obj)], "compiling the kernel glue")
    # -Bsymbolic: the kernels' hook variables bind inside the library even if the host process
    # (e.g. Python with TVM imported) defines the same names.
    run_tool([tc.cc, "-shared", "-fPIC", "-Wl,-Bsymbolic", "-Wl,-z,noexecstack", "-Wl,--no-undefined", "-s",
              "-o", str(out), *map(str, objs), str(glue_obj), "-lm"], f"linking kernels for '{target.name}'")
    glue_obj.unlink()


class CpuBackend:
    kind = "cpu"

    def check_toolchain(self, targets: list[CpuTarget]) -> None:
        for arch in sorted({t.arch for t in targets}):
            Toolchain.for_arch(arch)

    def compile(self, kernels: dict, target: CpuTarget, folder: str, w) -> Compiled:
        objs, together = build_objects(kernels, target, w.path(f"{folder}/kernels.o"))
        link_kernels(objs, target, w.path(f"{folder}/kernels.so"))
        for obj in objs:
            obj.unlink()
        note = f", {len(together)} kernel(s) whose parallel tasks meet at a barrier run them together" if together else ""
        return Compiled([(name, symbol_of(name), len(f.params)) for name, f in kernels.items()],
                        {name: {"parallel": "together"} for name in together},
                        {"parallel_together": together} if together else {}, note)

    def plan_fields(self) -> dict[str, Any]:
        return {}

    def manifest_files(self, folder: str) -> dict[str, str]:
        return {"kernels": f"{folder}/kernels.so"}

    def readme_cell(self, target: CpuTarget) -> str:
        return f"{target.isa} / {target.mcpu}"

    def inspect_line(self, report: dict[str, Any]) -> str:
        return f"{report['arch']} {report.get('isa', '')} mcpu={report.get('mcpu', '')}"

    def runner(self, pkg, target: dict[str, Any]) -> tuple[list[str] | None, str]:
        arch = target["arch"]
        cli = str(pkg.cli(arch))
        if arch == host_arch():
            missing = set(target.get("cpu_features", [])) - host_cpu_flags()
            if missing:
                return None, f"this CPU lacks {' '.join(sorted(missing))}"
            return [cli], ""
        qemu = shutil.which(f"qemu-{arch}") or shutil.which(f"qemu-{arch}-static")
        if qemu is None:
            return None, f"needs qemu-{arch} to run {arch} code here (Debian/Ubuntu: apt-get install qemu-user)"
        sysroot = QEMU_SYSROOT.get(arch, f"/usr/{ARCHES[arch]}")
        if not Path(sysroot).is_dir():
            return None, f"needs the {arch} C library in {sysroot} (apt-get install g++-{ARCHES[arch]})"
        return [qemu, "-L", sysroot, cli], ""

    def reference_on_gpu(self) -> bool:
        return False

    def emulated(self) -> bool:
        return False

    def roofline_peaks(self, target: dict[str, Any], threads: int) -> tuple[float, float]:
        return (target.get("flops_per_cycle", 16) * host_ghz() * threads,
                target.get("dram_gbs_per_core", 6.0) * threads)


BACKEND = CpuBackend()
