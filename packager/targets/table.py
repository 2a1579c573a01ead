"""The hardware table: every target the packager knows, as data.

CPU rows carry what code generation and the rule-based scheduler need (LLVM triple/cpu/attrs,
vector width, the CPU features the runtime must find before it runs the kernels). GPU rows carry
the datasheet facts the GPU schedules and cost reports need; their kernels are CUDA C compiled
offline (packager/codegen/cuda.py). Which backend serves a row is its `kind`
(packager/codegen/backend.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Union

# Static __shared__ arrays are limited to 48 KB per block on every CUDA architecture (more needs
# dynamic shared memory and an opt-in attribute per kernel).
STATIC_SHARED_BYTES = 48 * 1024
ARCHES = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}
ARCH_ALIASES = {"x86-64": "x86_64", "x86_64": "x86_64", "amd64": "x86_64",
                "arm64": "aarch64", "aarch64": "aarch64"}

# /proc/cpuinfo flags the runtime checks before it runs a target's kernels.
# flops_per_cycle: fp32 peak per core = FMA pipes x lanes x 2 (two 256/512-bit FMA pipes on
# Haswell+ / Zen 4-5 / Skylake-SP, two 128-bit NEON FMA pipes on Cortex-A7x/Neoverse N1).
# dram_gbs_per_core: nominal share of DRAM bandwidth one core can draw (about 8 DDR4/DDR5 channels
# over 32-64 cores on servers); only used to place kernels on the roofline in `pack bench`.
X86_ISA = {
    "avx2": {"mcpu": "x86-64-v3", "vector_bits": 256, "flops_per_cycle": 32, "dram_gbs_per_core": 10.0,
             "features": ("avx2", "fma", "f16c", "bmi2")},
    "avx512": {"mcpu": "x86-64-v4", "vector_bits": 512, "flops_per_cycle": 64, "dram_gbs_per_core": 10.0,
               "features": ("avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")},
}
# Extensions an `x86-64` target takes from its build host (/proc/cpuinfo flag -> LLVM attribute),
# where its ISA has them: AVX-512 VNNI (Cascade Lake and later Xeons, Zen 4/5) runs the int8
# kernels' vpdpbusd. Named targets (x86-avx512) and an explicit isa take none.
HOST_EXTENSIONS = {"avx512": {"avx512_vnni": "+avx512vnni"}}
# LLVM features an x86 CPU (mcpu) or mattr turns on beyond its ISA row -> the /proc/cpuinfo flags the
# runtime then also checks (a package built for mcpu: sapphirerapids may use VNNI in any kernel).
X86_HWCAPS = {"avx512vnni": ("avx512_vnni",), "avxvnni": ("avx_vnni",), "avx512bf16": ("avx512_bf16",),
              "amx-tile": ("amx_tile",), "amx-int8": ("amx_int8",), "amx-bf16": ("amx_bf16",)}
ARM_ISA = {"neon": {"mcpu": "generic", "vector_bits": 128, "flops_per_cycle": 16, "dram_gbs_per_core": 6.0,
                    "features": ("asimd",)}}
# LLVM features an Arm CPU (mcpu) or mattr turns on -> the Linux hwcaps (/proc/cpuinfo "Features")
# the runtime then also checks: LLVM may use these instructions in any kernel once they are on.
ARM_HWCAPS = {"fullfp16": ("fphp", "asimdhp"), "dotprod": ("asimddp",)}


@lru_cache(maxsize=None)
def llvm_cpu_features(triple: str, mcpu: str, mattr: tuple[str, ...]) -> frozenset[str]:
    """The LLVM features code generation for this CPU and these attributes may use."""
    import tvm
    from tvm.target import codegen

    target = {"kind": "llvm", "mtriple": triple, "mcpu": mcpu, **({"mattr": list(mattr)} if mattr else {})}
    return frozenset(str(f) for f in codegen.llvm_get_cpu_features(tvm.target.Target(target)))


@dataclass(frozen=True)
class RpcDevice:
    """A board behind a TVM RPC tracker that times a CPU target's candidate kernels at build time
    (`targets[i].rpc` in the spec): the build host compiles, the board runs."""

    host: str
    port: int
    key: str                       # the device key its RPC server registered with the tracker
    timeout_s: int = 600           # session length the tracker grants per build
    where: str = ""                # "targets[1].rpc" for error messages

    def describe(self) -> str:
        return f"RPC device '{self.key}' via tracker {self.host}:{self.port}"


@dataclass(frozen=True)
class CpuTarget:
    """A CPU target: LLVM code generation plus the facts the schedule and runtime need."""

    name: str
    arch: str                      # "x86_64" | "aarch64"
    isa: str                       # "avx2" | "avx512" | "neon"
    mcpu: str
    mattr: tuple[str, ...] = ()
    vector_bits: int = 128
    features: tuple[str, ...] = ()
    flops_per_cycle: int = 16          # fp32, per core (see the ISA tables)
    dram_gbs_per_core: float = 6.0
    kind: str = "cpu"
    rpc: RpcDevice | None = None       # time candidates there instead of on this machine
    cold_weights: bool = False         # time candidates with the caches flushed: the model's weights
                                       # exceed the last-level cache (set per build by the CPU scheduler)

    @property
    def triple(self) -> str:
        return ARCHES[self.arch]

    @property
    def vector_lanes_f32(self) -> int:
        return self.vector_bits // 32

    @property
    def llvm_features(self) -> frozenset[str]:
        return llvm_cpu_features(self.triple, self.mcpu, self.mattr)

    @property
    def precisions(self) -> tuple[str, ...]:
        """What `optimize.precision` may ask of this target: fp16 on an Arm CPU with the FP16
        arithmetic extension (LLVM's `fullfp16`: Cortex-A55/A75 on, Orin's A78AE, Neoverse; named by
        mcpu or mattr '+fullfp16'); bf16 on an x86 CPU with AMX-BF16 tiles (LLVM's `amx-bf16`: mcpu
        sapphirerapids and later, or mattr ['+amx-tile', '+amx-bf16'])."""
        if self.arch == "aarch64" and "fullfp16" in self.llvm_features:
            return ("fp32", "fp16")
        if self.arch == "x86_64" and "amx-bf16" in self.llvm_features:
            return ("fp32", "bf16")
        return ("fp32",)

    def llvm_target(self) -> dict[str, Any]:
        """The TVM target dict (TVM 0.27 takes dicts; never 'native', which silently becomes generic)."""
        t: dict[str, Any] = {"kind": "llvm", "mtriple": self.triple, "mcpu": self.mcpu}
        if self.mattr:
            t["mattr"] = list(self.mattr)
        return t

    def describe(self) -> dict[str, Any]:
        return {"kind": "cpu", "arch": self.arch, "isa": self.isa, "mcpu": self.mcpu,
                "mattr": list(self.mattr), "vector_bits": self.vector_bits, "cpu_features": list(self.features),
                "flops_per_cycle": self.flops_per_cycle, "dram_gbs_per_core": self.dram_gbs_per_core}


@dataclass(frozen=True)
class CudaTarget:
    """A CUDA target: device code for one SM architecture plus the host CPU architecture that
    runs the runtime (x86-64 servers; Jetson Orin is an aarch64 host)."""

    name: str
    sm: str                        # "sm_80"
    arch: str = "x86_64"           # host CPU architecture of the runtime
    facts: dict[str, Any] = field(default_factory=dict)
    kind: str = "cuda"

    @property
    def sm_number(self) -> int:
        return int(self.sm.split("_")[1])

    @property
    def max_shared_bytes(self) -> int:
        """Shared memory one block may use with the opt-in attribute (the runtime sets it for a
        launch with dynamic shared memory): the table row's, else the architecture's (SHARED_OPTIN_KB)."""
        kb = self.facts.get("smem_per_block_kb") or SHARED_OPTIN_KB.get(self.sm_number, 48)
        return int(kb) * 1024

    @property
    def sm_count(self) -> int:
        """Streaming multiprocessors: the table row's, else 80 (a V100's; a spec-defined GPU
        names no count)."""
        return int(self.facts.get("sms", 80))

    @property
    def precisions(self) -> tuple[str, ...]:
        """What `optimize.precision` may ask of this target: fp16 (tensor cores) from sm_75, the
        architectures nvcc builds. Volta (sm_70/72) compiles through CUDA 12's NVRTC, whose wheels
        lack the crt/mma.h the wmma kernels include. bf16 (sm_80+) is not built by this version:
        TVM's CUDA tensor-core rule takes fp16."""
        return ("fp32", "fp16") if self.sm_number >= 75 else ("fp32",)

    def tvm_target(self) -> dict[str, Any]:
        """TVM's CUDA target. Shared memory stays at the portable 48 KB static limit, and is said
        so: dlight's rules otherwise warn per kernel that the target does not name it."""
        t: dict[str, Any] = {"kind": "cuda", "arch": self.sm, "max_shared_memory_per_block": STATIC_SHARED_BYTES}
        if "max_threads_per_block" in self.facts:
            t["max_num_threads"] = self.facts["max_threads_per_block"]
        return t

    def describe(self) -> dict[str, Any]:
        return {"kind": "cuda", "sm": self.sm, "arch": self.arch, **self.facts}


def _gpu(sms: int, smem_block_kb: int, smem_sm_kb: int, regs_sm: int, l2_mb: float, dram_gbs: float,
         fp32_tflops: float, fp16_tflops: float, clock_mhz: int, threads_sm: int = 2048,
         blocks_sm: int = 32) -> dict[str, Any]:
    return {"sms": sms, "smem_per_block_kb": smem_block_kb, "smem_per_sm_kb": smem_sm_kb,
            "registers_per_sm": regs_sm, "max_threads_per_block": 1024, "max_threads_per_sm": threads_sm,
            "max_blocks_per_sm": blocks_sm, "warp_size": 32, "l2_mb": l2_mb,
            "dram_gbs": dram_gbs, "fp32_tflops": fp32_tflops, "fp16_tensor_tflops": fp16_tflops,
            "boost_clock_mhz": clock_mhz}


# GPU rows (vendor figures; fp16 = dense tensor-core peak):
# A100 SXM4 40GB: NVIDIA A100 datasheet + Ampere GA100 whitepaper (108 SMs, 164 KB smem/SM, 163 KB
#   opt-in per block, 40 MB L2, 1555 GB/s HBM2, 19.5 TF fp32, 312 TF fp16, 1410 MHz).
# V100 SXM2 16GB: Volta GV100 whitepaper (80 SMs, 96 KB smem per SM and per block, 6 MB L2,
#   900 GB/s, 15.7 TF fp32, 125 TF fp16, 1530 MHz).
# Jetson AGX Orin 64GB: Jetson AGX Orin datasheet / Ampere GA10B (2 GPCs, 16 SMs, 164 KB smem/SM,
#   4 MB L2, 204.8 GB/s LPDDR5 shared with the CPU, 5.3 TF fp32, 85 TF fp16 dense at 1300 MHz).
# H100 SXM5 80GB: NVIDIA H100 datasheet + Hopper whitepaper (132 SMs, 228 KB smem/SM, 227 KB per
#   block, 50 MB L2, 3350 GB/s HBM3, 67 TF fp32, 989 TF fp16 dense, 1980 MHz).
# All four: 64K 32-bit registers per SM, 1024 threads per block. Resident threads / blocks per SM
# (CUDA C++ Programming Guide, technical specifications per compute capability): 2048 / 32 on
# 7.0, 8.0 and 9.0; 1536 / 16 on 8.7 (Orin). Cooperative kernels' grids are sized by these.
CUDA_TABLE = {
    "a100": CudaTarget("a100", "sm_80", facts=_gpu(108, 163, 164, 65536, 40, 1555, 19.5, 312, 1410)),
    "v100": CudaTarget("v100", "sm_70", facts=_gpu(80, 96, 96, 65536, 6, 900, 15.7, 125, 1530)),
    "orin": CudaTarget("orin", "sm_87", arch="aarch64", facts=_gpu(16, 163, 164, 65536, 4, 204.8, 5.3, 85, 1300,
                                                                   threads_sm=1536, blocks_sm=16)),
    "h100": CudaTarget("h100", "sm_90", facts=_gpu(132, 227, 228, 65536, 50, 3350, 67, 989, 1980)),
}
# Shared memory per block with the opt-in attribute, KB, by compute capability (CUDA C++
# Programming Guide, technical specifications): what a custom target (no table row) may use.
SHARED_OPTIN_KB = {70: 96, 72: 96, 75: 64, 80: 163, 86: 99, 87: 163, 89: 99, 90: 227, 100: 227, 103: 227,
                   120: 99}
# Architectures the offline compilers can target: nvcc (CUDA 13) from sm_75; NVRTC (CUDA 12
# wheels) for Volta sm_70/sm_72.
CUDA_SM_RANGE = (70, 120)
CPU_NAMES = ("x86-64", "x86-avx2", "x86-avx512", "x86-avx512-vnni", "arm64")

# Any row of the table; code outside targets/ and the backends uses this, never the classes.
Target = Union[CpuTarget, CudaTarget]
