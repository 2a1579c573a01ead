"""The C/C++ compilers of each CPU architecture (kernel linking, runtime builds)."""
from __future__ import annotations

import shutil
from dataclasses import dataclass

from ..errors import UserError
from .host import host_arch
from .table import ARCHES


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
