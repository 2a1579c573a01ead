"""CUDA C -> a fatbin per CUDA target, offline (no GPU, no driver, no system CUDA toolkit).

nvcc (CUDA 13) compiles sm_75 and newer. It comes from the CUDA 13 wheels the packager depends on
(nvidia-cuda-nvcc: nvcc, ptxas, fatbinary; nvidia-nvvm: cicc; nvidia-cuda-runtime, -crt, -cccl:
the headers TVM's CUDA source includes), laid out as nvidia/cu13/{bin,nvvm,include}; the wheel's
nvcc.profile finds cicc and the include folders itself. Without the nvidia-cuda-nvcc wheel, nvcc
and fatbinary on PATH are used. CUDA 13 dropped Volta, so sm_70/sm_72 go through NVRTC from the
CUDA 12 wheels (nvidia-cuda-nvrtc-cu12 + the headers of nvidia-cuda-cccl-cu12 and
nvidia-cuda-runtime-cu12), packed by the fatbinary above. Each target gets one fatbin holding the
SASS for its architecture and the PTX of the same architecture (so a newer GPU can JIT it).
Results are cached by source hash.
"""
from __future__ import annotations

import ctypes
import glob
import hashlib
import importlib.metadata
import os
import re
import shutil
import tempfile
from pathlib import Path

from ..cache import cache_dir, filling, locked
from ..errors import InternalError, UserError
from .tools import run_tool

NVCC_MIN_SM = 75                   # CUDA 13's oldest architecture

# The CUDA 13 toolchain wheels, pinned alike in pyproject.toml (a test checks): CUDA 13.0 Update 2,
# the versions cuda-toolkit 13.0.2/13.0.3 pin (torch 2.13.0 requires cuda-toolkit[cudart]==13.0.3).
CUDA13_WHEELS = {
    "nvidia-cuda-nvcc": "13.0.88",     # bin/: nvcc, ptxas, fatbinary, nvlink, cudafe++
    "nvidia-nvvm": "13.0.88",          # nvvm/bin/cicc (CUDA C -> PTX) and libdevice
    "nvidia-cuda-runtime": "13.0.96",  # include/: cuda_runtime.h, cuda.h, cuda_fp16.h, ...
    "nvidia-cuda-crt": "13.0.88",      # include/crt/: host_config.h, math_functions.h, ...
    "nvidia-cuda-cccl": "13.0.85",     # include/cccl/ and include/nv/target (cuda/std/*, <nv/target>)
}
CUOBJDUMP_WHEEL = "13.5.37"         # nvidia-cuda-cuobjdump: registers and shared memory per kernel
CUDA12_WHEELS = {                      # NVRTC for Volta (sm_70/sm_72), which CUDA 13 dropped
    "nvidia-cuda-nvrtc-cu12": "12.9.86",
    "nvidia-cuda-cccl-cu12": "12.9.27",
    "nvidia-cuda-runtime-cu12": "12.9.79",
}
PIP_CUDA13 = "pip install " + " ".join(f"{name}=={version}" for name, version in CUDA13_WHEELS.items())
PIP_CUDA12 = "pip install " + " ".join(f"{name}=={version}" for name, version in CUDA12_WHEELS.items())
# One file of each wheel that nvcc needs, relative to nvidia/cu13 (where nvcc is bin/nvcc).
_WHEEL_FILES = {
    "nvidia-nvvm": "nvvm/bin/cicc",
    "nvidia-cuda-runtime": "include/cuda_runtime.h",
    "nvidia-cuda-crt": "include/crt/host_config.h",
    "nvidia-cuda-cccl": "include/nv/target",
}


def _nvrtc_paths() -> tuple[Path, list[Path]]:
    """libnvrtc from nvidia-cuda-nvrtc-cu12 and the include folders of nvidia-cuda-cccl-cu12
    (cuda/std/*) and nvidia-cuda-runtime-cu12 (cuda_fp16.h, cuda_bf16.h: NVRTC has no built-in copy)."""
    try:
        import nvidia.cuda_cccl as cccl
        import nvidia.cuda_nvrtc as nvrtc
        import nvidia.cuda_runtime as cudart
    except ImportError:
        raise UserError("sm_70/sm_72 (Volta) need NVRTC from CUDA 12, since CUDA 13 dropped Volta: "
                        f"{PIP_CUDA12}") from None
    libs = sorted(glob.glob(os.path.join(list(nvrtc.__path__)[0], "lib", "libnvrtc.so.*")))
    if not libs:
        raise UserError(f"the nvidia-cuda-nvrtc-cu12 package holds no libnvrtc.so: {PIP_CUDA12} --force-reinstall")
    return Path(libs[0]), [Path(list(m.__path__)[0]) / "include" for m in (cccl, cudart)]


def _nvrtc(source: str, sm: str, ptx: bool) -> bytes:
    lib_path, includes = _nvrtc_paths()
    lib = ctypes.CDLL(str(lib_path))
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernels.cu", 0, None, None) != 0:
        raise InternalError("nvrtcCreateProgram failed")
    arch = sm.replace("sm_", "compute_") if ptx else sm
    opts = [f"--gpu-architecture={arch}".encode(), b"-default-device", b"-std=c++17",
            *(b"-I" + str(include).encode() for include in includes)]
    try:
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        if rc != 0:
            raise InternalError(f"NVRTC could not compile the kernels for {sm}:\n{log.value.decode()[-3000:]}")
        size_fn, get_fn = (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX) if ptx else (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN)
        size_fn(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        get_fn(prog, buf)
        return buf.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _wheel_bin() -> Path | None:
    """nvidia/cu13/bin of the installed nvidia-cuda-nvcc wheel, or None when it is not installed."""
    try:
        dist = importlib.metadata.distribution("nvidia-cuda-nvcc")
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == "nvcc" and f.parent.name == "bin":
            nvcc = Path(dist.locate_file(f))
            if nvcc.is_file():
                return nvcc.parent
    return None


def _tool(name: str) -> str:
    """nvcc or fatbinary: the nvidia-cuda-nvcc wheel's, else the one on PATH."""
    wheel_bin = _wheel_bin()
    if wheel_bin is not None:
        top = wheel_bin.parent
        for dist, rel in _WHEEL_FILES.items():
            if not (top / rel).exists():
                raise UserError(f"the CUDA 13 toolchain is incomplete: {top / rel} (from {dist}) is missing: "
                                f"{PIP_CUDA13}")
        if not os.access(wheel_bin / name, os.X_OK):
            raise UserError(f"'{name}' missing from the nvidia-cuda-nvcc wheel ({wheel_bin}): "
                            f"pip install --force-reinstall nvidia-cuda-nvcc=={CUDA13_WHEELS['nvidia-cuda-nvcc']}")
        return str(wheel_bin / name)
    path = shutil.which(name)
    if path is None:
        raise UserError(f"'{name}' not found: CUDA targets need CUDA 13's nvcc and fatbinary, from the "
                        f"nvidia-cuda-nvcc wheel (not installed) or on PATH: {PIP_CUDA13} (or build CPU targets only)")
    return path


_USAGE = re.compile(r"Function (\w+):\s*\n\s*REG:(\d+) STACK:\d+ SHARED:(\d+)")


def parse_resource_usage(text: str) -> dict[str, tuple[int, int]]:
    """cuobjdump --dump-resource-usage -> {function: (registers per thread, static shared bytes)}."""
    return {m.group(1): (int(m.group(2)), int(m.group(3))) for m in _USAGE.finditer(text)}


def resource_usage(fatbin: Path) -> dict[str, tuple[int, int]]:
    """Registers per thread and static shared memory of every function in a fatbin (cuobjdump, from
    the nvidia-cuda-cuobjdump wheel, else PATH): what a cooperative kernel's grid is sized by."""
    wheel_bin = _wheel_bin()
    tool = wheel_bin / "cuobjdump" if wheel_bin is not None else None
    if tool is None or not os.access(tool, os.X_OK):
        found = shutil.which("cuobjdump")
        if found is None:
            raise UserError("'cuobjdump' not found: sizing a cooperative CUDA kernel's grid needs it: "
                            f"pip install nvidia-cuda-cuobjdump=={CUOBJDUMP_WHEEL}")
        tool = Path(found)
    return parse_resource_usage(run_tool([str(tool), "--dump-resource-usage", str(fatbin)], "cuobjdump"))


def check_cuda_toolchain(min_sm: int) -> None:
    """Fail before anything is compiled when a CUDA target cannot be built on this host."""
    _tool("nvcc")
    _tool("fatbinary")
    if min_sm < NVCC_MIN_SM:
        _nvrtc_paths()


def compile_fatbin(source: str, sm: str, out: Path) -> str:
    """Compile CUDA C into a fatbin (SASS + PTX for `sm`); returns the compiler used."""
    n = int(sm.split("_")[1])
    compiler = "nvcc" if n >= NVCC_MIN_SM else "nvrtc"
    key = hashlib.sha256(f"{compiler}\0{sm}\0{source}".encode()).hexdigest()[:24]
    cached = cache_dir() / "cuda" / f"{key}.fatbin"
    with locked(cache_dir() / "cuda" / f"{key}.lock"):
        if not cached.is_file():
            with tempfile.TemporaryDirectory(prefix="packager-cuda-") as tmp:
                t = Path(tmp)
                (t / "kernels.cu").write_text(source)
                if compiler == "nvcc":
                    run_tool([_tool("nvcc"), "-fatbin", "-O3", "-std=c++17", "-Xfatbin=-compress=false",
                          f"-gencode=arch=compute_{n},code=[sm_{n},compute_{n}]",
                          "-o", str(t / "k.fatbin"), str(t / "kernels.cu")], f"nvcc for {sm}")
                else:
                    (t / "k.cubin").write_bytes(_nvrtc(source, sm, ptx=False))
                    (t / "k.ptx").write_bytes(_nvrtc(source, sm, ptx=True).rstrip(b"\0"))
                    run_tool([_tool("fatbinary"), "--64", f"--create={t / 'k.fatbin'}",
                          f"--image3=kind=elf,sm={n},file={t / 'k.cubin'}",
                          f"--image3=kind=ptx,sm={n},file={t / 'k.ptx'}"], f"fatbinary for {sm}")
                tmp_out = cached.with_suffix(".tmp")
                with filling(tmp_out):
                    cached.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(t / "k.fatbin", tmp_out)
                    tmp_out.replace(cached)
    shutil.copyfile(cached, out)
    return compiler
