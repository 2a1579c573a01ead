"""Running the external compilers and linkers the backends use."""
from __future__ import annotations

import subprocess

from ..errors import InternalError


def run_tool(cmd: list[str], what: str) -> str:
    """Run a compiler, linker or binary reader; its standard output, or on failure an
    InternalError with the end of its output."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise InternalError(f"{what} failed ({' '.join(cmd[:2])} ...):\n{(r.stdout + r.stderr).strip()[-2000:]}")
    return r.stdout
