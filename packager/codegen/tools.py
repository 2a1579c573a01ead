"""Running the external compilers and linkers the backends use."""
from __future__ import annotations

import re
import subprocess

from ..errors import InternalError


def run_tool(cmd: list[str], what: str) -> str:
    """Run a compiler, linker or binary reader; its standard output, or on failure an
    InternalError with the end of its output."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        text = (r.stdout + r.stderr).strip()
        errors = [ln for ln in text.splitlines() if re.search(r"\berror\b", ln, re.IGNORECASE)][:8]
        first = "\n".join(errors) + "\n...\n" if errors else ""   # warnings after them can fill the tail
        raise InternalError(f"{what} failed ({' '.join(cmd[:2])} ...):\n{first}{text[-1200:]}")
    return r.stdout
