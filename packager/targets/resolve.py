"""A spec's `targets:` entries -> concrete targets of the hardware table (or custom ones), with
errors that point at the spec's line and field."""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Callable

from ..errors import UserError
from ..spec import Spec, TargetSpec, spec_error
from .host import detected_x86_isa, detected_x86_mattr, host_arch, host_cpu_name
from .table import (ARCH_ALIASES, ARCHES, ARM_HWCAPS, ARM_ISA, CPU_NAMES, CUDA_SM_RANGE, CUDA_TABLE, X86_HWCAPS, X86_ISA,
                    CpuTarget, CudaTarget, RpcDevice, Target, llvm_cpu_features)


Fail = Callable[..., UserError]
CPU_DEFAULTS = {"x86-64": ("x86_64", None), "x86-avx2": ("x86_64", "avx2"),
                "x86-avx512": ("x86_64", "avx512"), "x86-avx512-vnni": ("x86_64", "avx512"), "arm64": ("aarch64", "neon")}
NAMED_MATTR = {"x86-avx512-vnni": ("+avx512vnni",)}     # a named row's LLVM attributes beyond its ISA


def resolve(ts: TargetSpec, spec: Spec | None = None) -> Target:
    """Turn one spec entry into a concrete target, or raise a UserError pointing at it."""

    def fail(msg: str, sub: str = "") -> UserError:
        where = ts.where + (f".{sub}" if sub else "")
        return spec_error(spec, where, msg) if spec else UserError(f"{where}: {msg}")

    fields = dict(ts.fields)
    kind = fields.pop("kind", None) or _implied_kind(ts.name, fields, fail)
    rpc = _rpc(fields.pop("rpc"), f"{ts.where}.rpc", fail) if "rpc" in fields else None
    if kind == "cuda":
        if rpc is not None:
            raise fail("a CUDA target's kernels are not timed at build time, so it takes no RPC device; "
                       "remove rpc (it applies to CPU targets)", "rpc")
        return _cuda(ts.name, fields, fail)
    if kind == "cpu":
        return replace(_cpu(ts.name, fields, fail), rpc=rpc)
    raise fail(f"unknown kind '{kind}'; expected cpu or cuda", "kind")


def _implied_kind(name: str, f: dict, fail: Fail) -> str:
    """A bare name (or an entry without `kind`): a table row's kind, or what its fields imply."""
    kind = "cuda" if (name in CUDA_TABLE or "sm" in f or str(f.get("arch", "")).startswith("sm_")) else "cpu"
    if kind == "cpu" and name not in CPU_NAMES and "arch" not in f:
        known = ", ".join(list(CPU_NAMES) + list(CUDA_TABLE))
        raise fail(f"unknown target '{name}'; known targets: {known} "
                   "(or give kind/arch/isa for a custom CPU target)")
    return kind


def _rpc(raw: Any, where: str, fail: Fail) -> RpcDevice:
    """`rpc: {tracker: host:port, key: name, timeout: seconds}`: the board that times candidates."""
    example = "e.g. rpc: {tracker: '10.0.0.5:9190', key: rk3588}"
    if not isinstance(raw, dict):
        raise fail(f"expected a mapping with tracker and key, {example}", "rpc")
    unknown = sorted(set(raw) - {"tracker", "key", "timeout"})
    if unknown:
        raise fail(f"unknown key(s) {', '.join(map(str, unknown))}; allowed: tracker, key, timeout", "rpc")
    m = re.fullmatch(r"(\[[^\]]+\]|[^:\s]+):(\d{1,5})", str(raw.get("tracker", "")))
    if not m or not 0 < int(m.group(2)) < 65536:
        raise fail(f"expected the tracker as host:port, got {raw.get('tracker')!r} ({example})", "rpc.tracker")
    key = raw.get("key")
    if not isinstance(key, str) or not re.fullmatch(r"[\w.\-]+", key):
        raise fail(f"expected the device key its RPC server registered (letters, digits, . _ -), got {key!r}",
                   "rpc.key")
    timeout = raw.get("timeout", 600)
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
        raise fail(f"expected the session length in seconds (a positive integer), got {timeout!r}", "rpc.timeout")
    return RpcDevice(m.group(1).strip("[]"), int(m.group(2)), key, timeout, where)


def _cuda(name: str, f: dict, fail: Fail) -> CudaTarget:
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


def _cpu(name: str, f: dict, fail: Fail) -> CpuTarget:
    default_arch, default_isa = CPU_DEFAULTS.get(name, (None, None))
    arch_raw = f.pop("arch", default_arch)
    arch = ARCH_ALIASES.get(str(arch_raw).lower()) if arch_raw else None
    if arch is None:
        raise fail(f"unknown arch {arch_raw!r}; expected x86-64 or arm64", "arch")
    isa = f.pop("isa", default_isa)
    mcpu = f.pop("mcpu", None)
    mattr = f.pop("mattr", [])
    if not isinstance(mattr, list) or not all(isinstance(a, str) for a in mattr):
        raise fail("expected a list of LLVM attributes, e.g. ['+avx2']", "mattr")
    if f:
        raise fail(f"unknown key(s) {', '.join(sorted(f))} for a CPU target")
    mcpu = _mcpu(mcpu, arch, fail)
    mattr = [*NAMED_MATTR.get(name, ()), *mattr]
    return _x86(name, isa, mcpu, tuple(mattr), fail) if arch == "x86_64" else _arm(name, isa, mcpu, tuple(mattr), fail)


def _mcpu(mcpu: str | None, arch: str, fail: Fail) -> str | None:
    """`native` becomes this machine's LLVM CPU name; any name is checked with LLVM."""
    if mcpu == "native":
        if arch != host_arch():
            raise fail(f"mcpu: native names this {host_arch()} machine's CPU, but the target is {arch}", "mcpu")
        mcpu = host_cpu_name()
    if mcpu is not None:
        _check_mcpu(str(mcpu), arch, fail)
    return mcpu


def _x86(name: str, isa: str | None, mcpu: str | None, mattr: tuple[str, ...], fail: Fail) -> CpuTarget:
    if isa is None:
        isa = detected_x86_isa()
        if isa is None:
            raise fail("cannot detect AVX2/AVX-512 on this build host; set isa: avx2 or isa: avx512", "isa")
        mattr = (*mattr, *detected_x86_mattr(isa))
    if not isinstance(isa, str) or isa not in X86_ISA:     # a list or mapping is not hashable
        raise fail(f"unknown x86 ISA {isa!r}; expected one of {', '.join(X86_ISA)}", "isa")
    row = X86_ISA[isa]
    mcpu, mattr = mcpu or row["mcpu"], tuple(dict.fromkeys(mattr))
    return CpuTarget(name, "x86_64", isa, mcpu, mattr, row["vector_bits"],
                     _checked_features(row["features"], X86_HWCAPS, "x86_64", mcpu, mattr),
                     row["flops_per_cycle"], row["dram_gbs_per_core"])


def _arm(name: str, isa: str | None, mcpu: str | None, mattr: tuple[str, ...], fail: Fail) -> CpuTarget:
    isa = isa or "neon"
    if not isinstance(isa, str) or isa not in ARM_ISA:     # a list or mapping is not hashable
        raise fail(f"unknown ARM ISA {isa!r}; expected neon", "isa")
    row = ARM_ISA[isa]
    mcpu, mattr = mcpu or row["mcpu"], mattr or ("+neon",)
    return CpuTarget(name, "aarch64", isa, mcpu, mattr, row["vector_bits"],
                     _checked_features(row["features"], ARM_HWCAPS, "aarch64", mcpu, mattr),
                     row["flops_per_cycle"], row["dram_gbs_per_core"])


def _checked_features(base: tuple[str, ...], hwcaps: dict[str, tuple[str, ...]], arch: str, mcpu: str,
                      mattr: tuple[str, ...]) -> tuple[str, ...]:
    """The ISA row's CPU flags plus those of every LLVM feature the mcpu/mattr turn on (`hwcaps`:
    LLVM feature -> flags): LLVM may use those instructions in any kernel, so the runtime checks them."""
    enabled = llvm_cpu_features(ARCHES[arch], mcpu, mattr)
    extra = [cap for feature, caps in hwcaps.items() if feature in enabled for cap in caps]
    return tuple(dict.fromkeys((*base, *extra)))


def _check_mcpu(mcpu: str, arch: str, fail) -> None:
    import tvm  # noqa: F401  (registers the codegen functions)
    import tvm.target.codegen as codegen
    if not codegen.llvm_is_valid_cpu(mcpu, ARCHES[arch]):
        raise fail(f"LLVM does not know CPU '{mcpu}' for {arch}", "mcpu")


def resolve_all(spec: Spec, only: list[str] | None = None) -> list[Target]:
    """All targets of the spec (or the ones named by --target), resolved."""
    names = [t.name for t in spec.targets]
    for n in only or []:
        if n not in names:
            raise UserError(f"--target {n}: not in {spec.path} (its targets: {', '.join(names)})")
    targets = [resolve(t, spec) for t in spec.targets if not only or t.name in only]
    for t in targets:
        _check_precision(t, spec)
    return targets


def _precision_hint(t: Target, want: str) -> str:
    """How an Arm target gets fp16: a CPU with the FP16 extension (LLVM decides from mcpu/mattr)."""
    if isinstance(t, CpuTarget) and t.arch == "aarch64" and want == "fp16":
        return (f"its CPU (mcpu {t.mcpu}) has no FP16 arithmetic: name one that has (e.g. mcpu: cortex-a78ae, "
                "Jetson Orin's) or add mattr: ['+fullfp16'], or ")
    if isinstance(t, CpuTarget) and t.arch == "x86_64" and want == "bf16":
        return ("bf16 runs on AMX-BF16 tiles: name a CPU that has them (e.g. mcpu: sapphirerapids) or add "
                "mattr: ['+amx-tile', '+amx-bf16'], or ")
    return ""


def _check_precision(t: Target, spec: Spec) -> None:
    """A precision the target cannot compute in is the spec's error, not a silent fp32 build."""
    want = spec.optimize.precision_of(t.name)
    if want not in t.precisions:
        field = "optimize.precision" + (f".{t.name}" if t.name in spec.optimize.precision else "")
        msg = (f"target '{t.name}' cannot compute in {want} in this version (it takes {', '.join(t.precisions)}); "
               + _precision_hint(t, want) + f"choose one of those for it, e.g. precision: {{{t.name}: fp32}}")
        if spec.reader is not None:
            spec.reader.fail(field, msg)
        raise UserError(f"{spec.path}: {field}: {msg}")


