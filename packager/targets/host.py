"""What this machine is: CPU flags, architecture, LLVM CPU name, clock, and its CUDA device (if any).

Probed once per process; the build, the schedulers' measurement choice and the local runners use it.
"""
from __future__ import annotations

import platform
from functools import lru_cache
from pathlib import Path

from .table import ARCH_ALIASES, HOST_EXTENSIONS, CpuTarget, X86_ISA


@lru_cache(maxsize=1)
def host_cpu_flags() -> frozenset[str]:
    """CPU feature flags of this machine (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip()
        if key in ("flags", "Features"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def host_arch() -> str:
    return ARCH_ALIASES.get(platform.machine().lower(), platform.machine().lower())


def host_cpu_name() -> str:
    """LLVM's name for this CPU (e.g. znver5), for `mcpu: native`."""
    import tvm.target.codegen as codegen
    return str(codegen.llvm_get_system_cpu())


def host_ghz() -> float:
    """This machine's CPU clock in GHz (highest 'cpu MHz' in /proc/cpuinfo; 3.0 if unknown)."""
    try:
        mhz = [float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.startswith("cpu MHz")]
    except (OSError, ValueError, IndexError):
        mhz = []
    return max(mhz) / 1000 if mhz else 3.0


@lru_cache(maxsize=1)
def local_cuda_sm() -> tuple[int | None, str]:
    """Compute capability of this machine's CUDA device 0 (e.g. 90) through the driver API, or
    None and why not. Loads libcuda.so.1 like the runtime does; needs no CUDA toolkit."""
    import ctypes

    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return None, f"no CUDA driver ({e})"
    dev, major, minor, count = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if cu.cuInit(0) != 0 or cu.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return None, "the CUDA driver finds no GPU"
    cu.cuDeviceGet(ctypes.byref(dev), 0)
    cu.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)
    cu.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)
    return major.value * 10 + minor.value, ""


def can_run_here(t: CpuTarget) -> bool:
    """Whether this machine can execute the target's code natively."""
    return t.arch == host_arch() and set(t.features) <= host_cpu_flags()



def detected_x86_isa() -> str | None:
    flags = host_cpu_flags()
    if host_arch() != "x86_64":
        return None
    if set(X86_ISA["avx512"]["features"]) <= flags:
        return "avx512"
    if set(X86_ISA["avx2"]["features"]) <= flags:
        return "avx2"
    return None


def detected_x86_mattr(isa: str) -> tuple[str, ...]:
    """The LLVM attributes of this build host's extensions an `x86-64` target of this ISA takes
    (HOST_EXTENSIONS: AVX-512 VNNI)."""
    flags = host_cpu_flags()
    return tuple(attr for flag, attr in HOST_EXTENSIONS.get(isa, {}).items() if flag in flags)
