"""Targets: the hardware table (table), this machine (host), spec entries -> targets (resolve) and
the C/C++ toolchains (toolchain)."""
from .host import can_run_here, detected_x86_isa, host_arch, host_cpu_flags, host_cpu_name, host_ghz, local_cuda_sm
from .resolve import resolve, resolve_all
from .table import (ARCH_ALIASES, ARCHES, ARM_ISA, CPU_NAMES, CUDA_SM_RANGE, CUDA_TABLE, X86_ISA, CpuTarget,
                    CudaTarget, RpcDevice, Target)
from .toolchain import Toolchain

__all__ = ["ARCHES", "ARCH_ALIASES", "ARM_ISA", "CPU_NAMES", "CUDA_SM_RANGE", "CUDA_TABLE", "X86_ISA", "CpuTarget",
           "CudaTarget", "RpcDevice", "Target", "Toolchain", "can_run_here", "detected_x86_isa", "host_arch", "host_cpu_flags",
           "host_cpu_name", "host_ghz", "local_cuda_sm", "resolve", "resolve_all"]
