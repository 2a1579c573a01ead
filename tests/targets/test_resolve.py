"""The hardware table and how spec entries resolve to concrete targets."""
from __future__ import annotations

import pytest

from packager import targets as T
from packager.targets import host as H
from packager.targets import toolchain as TC
from packager.errors import UserError
from packager.spec import TargetSpec


def r(name, **fields):
    return T.resolve(TargetSpec(name, fields, "targets[0]"))


def test_named_cpu_targets():
    avx2 = r("x86-avx2")
    assert (avx2.arch, avx2.isa, avx2.mcpu, avx2.vector_bits) == ("x86_64", "avx2", "x86-64-v3", 256)
    assert avx2.llvm_target() == {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64-v3"}
    avx512 = r("x86-avx512")
    assert "avx512f" in avx512.features and avx512.vector_lanes_f32 == 16
    arm = r("arm64")
    assert arm.llvm_target() == {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "generic", "mattr": ["+neon"]}


def test_x86_64_detects_the_build_hosts_isa(monkeypatch):
    monkeypatch.setattr(H, "host_arch", lambda: "x86_64")
    monkeypatch.setattr(H, "host_cpu_flags", lambda: frozenset(T.X86_ISA["avx512"]["features"]))
    assert r("x86-64").isa == "avx512"
    monkeypatch.setattr(H, "host_cpu_flags", lambda: frozenset(T.X86_ISA["avx2"]["features"]))
    assert r("x86-64").isa == "avx2"
    monkeypatch.setattr(H, "host_cpu_flags", lambda: frozenset({"sse2"}))
    with pytest.raises(UserError, match="set isa: avx2 or isa: avx512"):
        r("x86-64")


def test_x86_64_takes_the_build_hosts_vnni_and_the_runtime_checks_for_it(monkeypatch):
    """An AVX-512 host with VNNI gives x86-64 `+avx512vnni` (the int8 kernels' vpdpbusd) and the
    runtime's check of avx512_vnni; a host without it, and the named x86-avx512 row, neither. A
    named CPU's extensions (sapphirerapids: VNNI, BF16, AMX) are checked too."""
    monkeypatch.setattr(H, "host_arch", lambda: "x86_64")
    avx512 = frozenset(T.X86_ISA["avx512"]["features"])
    monkeypatch.setattr(H, "host_cpu_flags", lambda: avx512 | {"avx512_vnni"})
    vnni = r("x86-64")
    assert vnni.isa == "avx512" and vnni.mattr == ("+avx512vnni",) and "avx512_vnni" in vnni.features
    assert "avx512vnni" in vnni.llvm_features
    assert r("x86-avx512").mattr == () and "avx512_vnni" not in r("x86-avx512").features
    assert r("x86-avx512-vnni").mattr == ("+avx512vnni",)
    assert r("x86-64", isa="avx512").mattr == ()                 # an explicit isa takes nothing from the host
    monkeypatch.setattr(H, "host_cpu_flags", lambda: avx512)
    assert r("x86-64").mattr == () and "avx512_vnni" not in r("x86-64").features
    spr = r("x86-64", isa="avx512", mcpu="sapphirerapids")
    assert {"avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"} <= set(spr.features)
    assert spr.precisions == ("fp32", "bf16") and r("x86-64").precisions == ("fp32",)   # bf16 needs AMX tiles


def test_an_arm_cpu_with_fp16_arithmetic_takes_fp16_and_its_runtime_checks_for_it():
    """LLVM's features of the mcpu (or mattr) decide: Orin's A78AE has FP16 arithmetic and dot
    products, so fp16 is offered and the runtime checks the hwcaps those instructions need; the
    generic ARMv8.0 row has neither, and x86 computes in fp32 only."""
    a78 = r("orin-cpu", kind="cpu", arch="arm64", mcpu="cortex-a78ae")
    assert a78.precisions == ("fp32", "fp16")
    assert {"asimd", "fphp", "asimdhp", "asimddp"} == set(a78.features)
    generic = r("arm64")
    assert generic.precisions == ("fp32",) and generic.features == ("asimd",)
    plus = r("a", kind="cpu", arch="arm64", mattr=["+neon", "+fullfp16"])
    assert plus.precisions == ("fp32", "fp16") and "asimddp" not in plus.features
    assert r("x86-avx512").precisions == ("fp32",)


def test_custom_targets_and_native_cpu():
    a78 = r("orin-cpu", kind="cpu", arch="arm64", mcpu="cortex-a78ae")
    assert a78.arch == "aarch64" and a78.mcpu == "cortex-a78ae"
    if T.host_arch() == "x86_64":
        native = r("mine", kind="cpu", arch="x86-64", mcpu="native")
        assert native.mcpu not in ("native", "generic", "")
        with pytest.raises(UserError, match="mcpu: native names this x86_64 machine"):
            r("other", kind="cpu", arch="arm64", mcpu="native")


@pytest.mark.parametrize("name,fields,msg", [
    ("x86-65", {}, "unknown target 'x86-65'"),
    ("t", {"kind": "cpu", "arch": "riscv"}, "unknown arch 'riscv'"),
    ("t", {"kind": "cpu", "arch": "x86-64", "isa": "sse9"}, "unknown x86 ISA 'sse9'"),
    ("t", {"kind": "cpu", "arch": "arm64", "mcpu": "pentium9000"}, "LLVM does not know CPU 'pentium9000'"),
    ("t", {"kind": "tpu"}, "unknown kind 'tpu'"),
    ("t", {"kind": "cuda"}, "needs `arch: sm_XX`"),
    ("a100", {"isa": "avx2"}, "do not apply to a CUDA target"),
    ("t", {"kind": "cpu", "arch": "x86-64", "mattr": "+avx2"}, "expected a list of LLVM attributes"),
    ("arm64", {"rpc": "10.0.0.5:9190"}, r"rpc: expected a mapping with tracker and key"),
    ("arm64", {"rpc": {"tracker": "10.0.0.5", "key": "b"}}, r"rpc.tracker: expected the tracker as host:port"),
    ("arm64", {"rpc": {"tracker": "h:99999", "key": "b"}}, r"rpc.tracker: expected the tracker as host:port"),
    ("arm64", {"rpc": {"tracker": "h:9190"}}, r"rpc.key: expected the device key"),
    ("arm64", {"rpc": {"tracker": "h:9190", "key": "b", "timeout": 0}}, r"rpc.timeout: expected the session length"),
    ("arm64", {"rpc": {"tracker": "h:9190", "key": "b", "port": 1}}, r"rpc: unknown key\(s\) port"),
    ("orin", {"rpc": {"tracker": "h:9190", "key": "jetson"}}, r"rpc: a CUDA target's kernels are not timed"),
])
def test_target_errors(name, fields, msg):
    with pytest.raises(UserError, match=msg) as e:
        r(name, **fields)
    assert "targets[0]" in str(e.value)


def test_rpc_device_of_a_cpu_target():
    """The board that times a target's candidates; without rpc a target has none."""
    arm = r("arm64", rpc={"tracker": "10.0.0.5:9190", "key": "rk3588", "timeout": 120})
    assert arm.rpc == T.RpcDevice("10.0.0.5", 9190, "rk3588", 120, "targets[0].rpc")
    assert r("arm64", rpc={"tracker": "[::1]:9190", "key": "b"}).rpc.host == "::1"
    assert r("arm64").rpc is None and r("arm64").mcpu == arm.mcpu


def test_cuda_rows():
    assert r("a100").sm == "sm_80" and r("v100").sm == "sm_70" and r("h100").sm == "sm_90"
    orin = r("orin")
    assert orin.sm == "sm_87" and orin.arch == "aarch64"
    assert r("mygpu", kind="cuda", sm="sm_86").sm == "sm_86"


def test_missing_cross_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(TC.shutil, "which", lambda tool: None)
    with pytest.raises(UserError, match="apt-get install g\\+\\+-aarch64-linux-gnu"):
        T.Toolchain.for_arch("aarch64" if T.host_arch() != "aarch64" else "x86_64")
