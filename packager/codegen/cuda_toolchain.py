"""CUDA C -> a fatbin per CUDA target, offline (no GPU, no driver).

nvcc (CUDA 13) compiles sm_75 and newer; CUDA 13 dropped Volta, so sm_70/sm_72 go through NVRTC
from the CUDA 12 wheels (nvidia-cuda-nvrtc-cu12 + the headers of nvidia-cuda-cccl-cu12). Each
target gets one fatbin holding the SASS for its architecture and the PTX of the same
architecture (so a newer GPU can JIT it). Results are cached by source hash.
"""
from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from ..cache import cache_dir, filling, locked
from ..errors import InternalError, UserError
from .tools import run_tool

NVCC_MIN_SM = 75                   # CUDA 13's oldest architecture


def _nvrtc_paths() -> tuple[Path, Path]:
    """libnvrtc from nvidia-cuda-nvrtc-cu12 and the include folder of nvidia-cuda-cccl-cu12."""
    try:
        import nvidia.cuda_cccl as cccl
        import nvidia.cuda_nvrtc as nvrtc
    except ImportError:
        raise UserError("sm_70/sm_72 (Volta) need NVRTC from CUDA 12, since CUDA 13 dropped Volta: "
                        "pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-cccl-cu12") from None
    libs = sorted(glob.glob(os.path.join(list(nvrtc.__path__)[0], "lib", "libnvrtc.so.*")))
    if not libs:
        raise UserError("the nvidia-cuda-nvrtc-cu12 package holds no libnvrtc.so; reinstall it")
    return Path(libs[0]), Path(list(cccl.__path__)[0]) / "include"


def _nvrtc(source: str, sm: str, ptx: bool) -> bytes:
    lib_path, include = _nvrtc_paths()
    lib = ctypes.CDLL(str(lib_path))
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernels.cu", 0, None, None) != 0:
        raise InternalError("nvrtcCreateProgram failed")
    arch = sm.replace("sm_", "compute_") if ptx else sm
    opts = [f"--gpu-architecture={arch}".encode(), b"-default-device", b"-std=c++17", b"-I" + str(include).encode()]
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


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise UserError(f"'{name}' not found on PATH: CUDA targets need the CUDA 13 toolkit's nvcc and fatbinary "
                        "(install the CUDA toolkit, or build CPU targets only)")
    return path


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
