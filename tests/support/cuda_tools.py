"""cuobjdump (from the nvidia-cuda-cuobjdump wheel, or the CUDA toolkit) over a fatbin: which
architectures it holds and each kernel's parameter count."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path


def cuobjdump() -> str | None:
    try:
        import nvidia.cu13
        for root in nvidia.cu13.__path__:
            p = Path(root) / "bin" / "cuobjdump"
            if p.is_file():
                return str(p)
    except ImportError:
        pass
    return shutil.which("cuobjdump")


def _run(*args: str) -> str:
    tool = cuobjdump()
    assert tool, "cuobjdump not found: pip install nvidia-cuda-cuobjdump"
    r = subprocess.run([tool, *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def elf_arches(fatbin: Path) -> list[str]:
    """The SASS architectures (e.g. ['sm_80']) in a fatbin."""
    return re.findall(r"ELF file\s+\d+:\s+\S+\.(sm_\d+)\.cubin", _run("--list-elf", str(fatbin)))


def ptx_arches(fatbin: Path) -> list[str]:
    return re.findall(r"PTX file\s+\d+:\s+\S+\.(sm_\d+)\.ptx", _run("--list-ptx", str(fatbin)))


def kernel_params(fatbin: Path) -> dict[str, int]:
    """Entry function -> number of kernel parameters (EIATTR_KPARAM_INFO records of its .nv.info)."""
    entries = re.findall(r"FUNC\s+GLOBAL\s+\S+\s+ENTRY\s+(\S+)", _run("-symbols", str(fatbin)))
    counts = dict.fromkeys(entries, 0)
    section = None
    for line in _run("-elf", str(fatbin)).splitlines():
        m = re.match(r"^\.nv\.info\.(\S+)$", line.strip()) if not line.startswith((" ", "\t")) else None
        if m:
            section = m.group(1)
        elif line and not line.startswith((" ", "\t")):
            section = None
        elif section in counts and "EIATTR_KPARAM_INFO" in line:
            counts[section] += 1
    return counts


def sass_counts(fatbin: Path, pattern: str) -> int | None:
    """How many SASS instructions of the fatbin match `pattern` (e.g. HMMA); None without nvdisasm,
    which cuobjdump runs for -sass (the nvidia-cuda-nvdisasm wheel puts it beside cuobjdump)."""
    tool = cuobjdump()
    if tool is None:
        return None
    env = {**os.environ, "PATH": f"{Path(tool).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if shutil.which("nvdisasm", path=env["PATH"]) is None:
        return None
    r = subprocess.run([tool, "-sass", str(fatbin)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return len(re.findall(rf"\b{pattern}\b", r.stdout))
