"""The hardware table: every target the packager knows, and how a spec entry becomes one.

CPU rows carry what code generation and the rule-based scheduler need (LLVM triple/cpu/attrs,
vector width, the CPU features the runtime must find before it runs the kernels). GPU rows are
carry the datasheet facts the GPU schedules and cost reports need; their kernels are CUDA C
compiled offline (packager/cuda_codegen.py).
"""
from __future__ import annotations

import platform
import re
import shutil
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import UserError
from .spec import Spec, TargetSpec, spec_error

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
ARM_ISA = {"neon": {"mcpu": "generic", "vector_bits": 128, "flops_per_cycle": 16, "dram_gbs_per_core": 6.0,
                    "features": ("asimd",)}}


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

    @property
    def triple(self) -> str:
        return ARCHES[self.arch]

    @property
    def vector_lanes_f32(self) -> int:
        return self.vector_bits // 32

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

    def tvm_target(self) -> dict[str, Any]:
        """TVM's CUDA target (shared memory stays at the portable 48 KB static limit)."""
        t: dict[str, Any] = {"kind": "cuda", "arch": self.sm}
        if "max_threads_per_block" in self.facts:
            t["max_num_threads"] = self.facts["max_threads_per_block"]
        return t

    def describe(self) -> dict[str, Any]:
        return {"kind": "cuda", "sm": self.sm, "arch": self.arch, **self.facts}


def _gpu(sms: int, smem_block_kb: int, smem_sm_kb: int, regs_sm: int, l2_mb: float, dram_gbs: float,
         fp32_tflops: float, fp16_tflops: float, clock_mhz: int) -> dict[str, Any]:
    return {"sms": sms, "smem_per_block_kb": smem_block_kb, "smem_per_sm_kb": smem_sm_kb,
            "registers_per_sm": regs_sm, "max_threads_per_block": 1024, "warp_size": 32, "l2_mb": l2_mb,
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
# All four: 64K 32-bit registers per SM, 1024 threads per block.
CUDA_TABLE = {
    "a100": CudaTarget("a100", "sm_80", facts=_gpu(108, 163, 164, 65536, 40, 1555, 19.5, 312, 1410)),
    "v100": CudaTarget("v100", "sm_70", facts=_gpu(80, 96, 96, 65536, 6, 900, 15.7, 125, 1530)),
    "orin": CudaTarget("orin", "sm_87", arch="aarch64", facts=_gpu(16, 163, 164, 65536, 4, 204.8, 5.3, 85, 1300)),
    "h100": CudaTarget("h100", "sm_90", facts=_gpu(132, 227, 228, 65536, 50, 3350, 67, 989, 1980)),
}
# Architectures the offline compilers can target: nvcc (CUDA 13) from sm_75; NVRTC (CUDA 12
# wheels) for Volta sm_70/sm_72.
CUDA_SM_RANGE = (70, 120)
CPU_NAMES = ("x86-64", "x86-avx2", "x86-avx512", "arm64")


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


def _x86(name: str, isa: str, mcpu: str | None, mattr: tuple[str, ...]) -> CpuTarget:
    row = X86_ISA[isa]
    return CpuTarget(name, "x86_64", isa, mcpu or row["mcpu"], mattr, row["vector_bits"], row["features"],
                     row["flops_per_cycle"], row["dram_gbs_per_core"])


def _detected_x86_isa() -> str | None:
    flags = host_cpu_flags()
    if host_arch() != "x86_64":
        return None
    if set(X86_ISA["avx512"]["features"]) <= flags:
        return "avx512"
    if set(X86_ISA["avx2"]["features"]) <= flags:
        return "avx2"
    return None


def resolve(ts: TargetSpec, spec: Spec | None = None) -> CpuTarget | CudaTarget:
    """Turn one spec entry into a concrete target, or raise a UserError pointing at it."""

    def fail(msg: str, sub: str = "") -> UserError:
        where = ts.where + (f".{sub}" if sub else "")
        return spec_error(spec, where, msg) if spec else UserError(f"{where}: {msg}")

    f = dict(ts.fields)
    kind = f.pop("kind", None)
    name = ts.name
    if kind is None:
        kind = "cuda" if (name in CUDA_TABLE or "sm" in f or str(f.get("arch", "")).startswith("sm_")) else "cpu"
        if kind == "cpu" and name not in CPU_NAMES and "arch" not in f:
            known = ", ".join(list(CPU_NAMES) + list(CUDA_TABLE))
            raise fail(f"unknown target '{name}'; known targets: {known} "
                       "(or give kind/arch/isa for a custom CPU target)")
    if kind == "cuda":
        base = CUDA_TABLE.get(name)
        arch_field = f.pop("arch", None)
        sm = str(f.pop("sm", arch_field) or (base.sm if base else ""))
        if not sm:
            raise fail("a custom CUDA target needs `arch: sm_XX`, e.g. arch: sm_86", "arch")
        m = re.fullmatch(r"sm_(\d+)", sm)
        if not m or not CUDA_SM_RANGE[0] <= int(m.group(1)) <= CUDA_SM_RANGE[1]:
            raise fail(f"unknown CUDA architecture {sm!r}; expected sm_70 ... sm_{CUDA_SM_RANGE[1]} (e.g. sm_86)", "arch")
        host = ARCH_ALIASES.get(str(f.pop("host_arch", base.arch if base else "x86_64")).lower())
        if host is None:
            raise fail("unknown host_arch; expected x86-64 or arm64", "host_arch")
        if f:
            raise fail(f"key(s) {', '.join(sorted(f))} do not apply to a CUDA target (kind, arch, host_arch)")
        facts = dict(base.facts) if base and base.sm == sm else {}
        return CudaTarget(name, sm, host, facts)
    if kind != "cpu":
        raise fail(f"unknown kind '{kind}'; expected cpu or cuda", "kind")

    defaults = {"x86-64": ("x86_64", None), "x86-avx2": ("x86_64", "avx2"),
                "x86-avx512": ("x86_64", "avx512"), "arm64": ("aarch64", "neon")}.get(name, (None, None))
    arch_raw = f.pop("arch", defaults[0])
    arch = ARCH_ALIASES.get(str(arch_raw).lower()) if arch_raw else None
    if arch is None:
        raise fail(f"unknown arch {arch_raw!r}; expected x86-64 or arm64", "arch")
    isa = f.pop("isa", defaults[1])
    mcpu = f.pop("mcpu", None)
    mattr = f.pop("mattr", [])
    if not isinstance(mattr, list) or not all(isinstance(a, str) for a in mattr):
        raise fail("expected a list of LLVM attributes, e.g. ['+avx2']", "mattr")
    if f:
        raise fail(f"unknown key(s) {', '.join(sorted(f))} for a CPU target")
    if mcpu == "native":
        if arch != host_arch():
            raise fail(f"mcpu: native names this {host_arch()} machine's CPU, but the target is {arch}", "mcpu")
        mcpu = host_cpu_name()
    if mcpu is not None:
        _check_mcpu(str(mcpu), arch, fail)
    if arch == "x86_64":
        if isa is None:
            isa = _detected_x86_isa()
            if isa is None:
                raise fail("cannot detect AVX2/AVX-512 on this build host; set isa: avx2 or isa: avx512", "isa")
        if isa not in X86_ISA:
            raise fail(f"unknown x86 ISA {isa!r}; expected one of {', '.join(X86_ISA)}", "isa")
        return _x86(name, isa, mcpu, tuple(mattr))
    isa = isa or "neon"
    if isa not in ARM_ISA:
        raise fail(f"unknown ARM ISA {isa!r}; expected neon", "isa")
    row = ARM_ISA[isa]
    return CpuTarget(name, "aarch64", isa, mcpu or row["mcpu"], tuple(mattr) or ("+neon",),
                     row["vector_bits"], row["features"], row["flops_per_cycle"], row["dram_gbs_per_core"])


def _check_mcpu(mcpu: str, arch: str, fail) -> None:
    import tvm  # noqa: F401  (registers the codegen functions)
    import tvm.target.codegen as codegen
    if not codegen.llvm_is_valid_cpu(mcpu, ARCHES[arch]):
        raise fail(f"LLVM does not know CPU '{mcpu}' for {arch}", "mcpu")


def resolve_all(spec: Spec, only: list[str] | None = None) -> list[CpuTarget | CudaTarget]:
    """All targets of the spec (or the ones named by --target), resolved."""
    names = [t.name for t in spec.targets]
    for n in only or []:
        if n not in names:
            raise UserError(f"--target {n}: not in {spec.path} (its targets: {', '.join(names)})")
    return [resolve(t, spec) for t in spec.targets if not only or t.name in only]


@dataclass(frozen=True)
class Toolchain:
    """The C/C++ compilers that link one architecture's kernels and build its runtime."""

    arch: str
    cc: str
    cxx: str

    @staticmethod
    def for_arch(arch: str) -> "Toolchain":
        if arch == host_arch():
            cc, cxx = "gcc", "g++"
        else:
            cc, cxx = f"{ARCHES[arch]}-gcc", f"{ARCHES[arch]}-g++"
        for tool in (cc, cxx):
            if shutil.which(tool) is None:
                pkg = "g++" if arch == host_arch() else f"g++-{ARCHES[arch]}"
                raise UserError(f"compiler '{tool}' for {arch} not found on PATH; install it "
                                f"(Debian/Ubuntu: apt-get install {pkg})")
        return Toolchain(arch, cc, cxx)
