"""The C/C++ compilers per architecture (targets/toolchain.py): this host's gcc natively, the
Debian cross compilers for the other architecture, a clear error when one is missing."""
from __future__ import annotations

import pytest

from packager.errors import UserError
from packager.targets import toolchain as TC
from packager.targets import Toolchain, host_arch


def test_the_host_uses_gcc_and_the_other_arch_its_cross_compiler(monkeypatch):
    monkeypatch.setattr(TC.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    assert Toolchain.for_arch(host_arch()) == Toolchain(host_arch(), "gcc", "g++")
    other = "aarch64" if host_arch() != "aarch64" else "x86_64"
    cross = Toolchain.for_arch(other)
    assert cross.cc == f"{TC.ARCHES[other]}-gcc" and cross.cxx == f"{TC.ARCHES[other]}-g++"


def test_a_missing_host_compiler_names_the_package(monkeypatch):
    monkeypatch.setattr(TC.shutil, "which", lambda tool: None)
    with pytest.raises(UserError, match=r"compiler 'gcc' for .* apt-get install g\+\+\)"):
        Toolchain.for_arch(host_arch())
