"""What this machine is (targets/host.py): CPU flags from /proc/cpuinfo, the clock, the x86 ISA
they imply, and whether a target's code runs here natively."""
from __future__ import annotations

from dataclasses import replace

import pytest

from packager.targets import host as H
from packager.targets import resolve
from packager.spec import TargetSpec


@pytest.fixture
def cpuinfo(tmp_path, monkeypatch):
    """Point the probes at a fake /proc/cpuinfo with the given flags and clocks."""
    def write(flags: str, mhz=(2000.0, 3500.5), key: str = "flags"):
        f = tmp_path / "cpuinfo"
        f.write_text("".join(f"processor\t: {i}\ncpu MHz\t\t: {m}\n{key}\t\t: {flags}\n\n" for i, m in enumerate(mhz)))
        real = H.Path
        monkeypatch.setattr(H, "Path", lambda p: f if p == "/proc/cpuinfo" else real(p))
        H.host_cpu_flags.cache_clear()
    yield write
    H.host_cpu_flags.cache_clear()


def test_flags_and_clock_come_from_cpuinfo(cpuinfo):
    cpuinfo("fpu sse2 avx2 fma", mhz=(1800.0, 3500.5))
    assert H.host_cpu_flags() == {"fpu", "sse2", "avx2", "fma"} and H.host_ghz() == pytest.approx(3.5005)


def test_arm_features_line_is_read_too(cpuinfo):
    cpuinfo("fp asimd aes", key="Features")
    assert "asimd" in H.host_cpu_flags()


def test_the_isa_is_the_widest_whose_features_are_all_there(cpuinfo, monkeypatch):
    monkeypatch.setattr(H, "host_arch", lambda: "x86_64")
    cpuinfo("avx2 fma f16c bmi2 avx512f")                 # avx512f alone is not AVX-512 as targeted
    assert H.detected_x86_isa() == "avx2"
    cpuinfo("avx2 fma f16c bmi2 avx512f avx512bw avx512cd avx512dq avx512vl")
    assert H.detected_x86_isa() == "avx512"
    cpuinfo("sse2")
    assert H.detected_x86_isa() is None


def test_a_target_runs_here_only_on_this_arch_with_its_features():
    arm = resolve(TargetSpec("arm64", {}, "a"))
    x86 = resolve(TargetSpec("x86-avx2", {}, "x"))
    assert H.can_run_here(arm) == (H.host_arch() == "aarch64")
    if H.host_arch() == "x86_64" and "avx2" in H.host_cpu_flags():
        assert H.can_run_here(x86) and not H.can_run_here(replace(x86, features=x86.features + ("no-such-flag",)))
