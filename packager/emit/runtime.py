"""Build the C++ runtime (libpackrt, packrt-run, the example) once per source hash and arch.

The runtime sources plus the third-party headers they need are staged into one self-contained
source tree (also shipped in every package so users can rebuild on the device), built with
CMake for each CPU architecture, and cached under ~/.cache/packager/runtime/.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from ..cache import cache_dir, filling, locked
from ..errors import InternalError, UserError
from .ort_headers import ort_headers
from ..targets import Toolchain, host_arch

ORT_LIBRARY = "libpackager_ort.so"

THIRD_PARTY_LICENSES = """Third-party headers bundled so this source tree builds with no network:
- nlohmann/  : JSON for Modern C++ (MIT), from Debian nlohmann-json3-dev
- CLI/       : CLI11 (BSD-3-Clause), from Debian libcli11-dev
- tvm/ffi/c_api.h, dlpack/dlpack.h : Apache TVM FFI / DLPack (Apache-2.0), from the apache-tvm-ffi wheel
- onnxruntime/ : ONNX Runtime C/C++ API headers (MIT), from Debian libonnxruntime-dev (for the custom-op library)
Copyright files are in licenses/.
"""


def data_dir(name: str) -> Path:
    """A folder shipped with the packager (runtime_cpp/, templates/): repo checkout or wheel data."""
    here = Path(__file__).resolve().parent.parent          # the packager package
    for candidate in (here / "_data" / name, here.parent / name):
        if candidate.is_dir():
            return candidate
    raise InternalError(f"packager installation is incomplete: folder '{name}' not found next to {here}")


def _third_party() -> list[tuple[Path, str]]:
    """(source, destination under third_party/) for every bundled header tree or file."""
    import tvm_ffi

    ffi = Path(tvm_ffi.__file__).resolve().parent
    items = [(Path("/usr/include/nlohmann"), "nlohmann"), (Path("/usr/include/CLI"), "CLI"),
             (ffi / "include" / "tvm" / "ffi" / "c_api.h", "tvm/ffi/c_api.h"),
             (ffi / "include" / "dlpack" / "dlpack.h", "dlpack/dlpack.h")]
    for src, _ in items[:2]:
        if not src.is_dir():
            raise UserError(f"{src} not found: install the C++ header packages "
                            "(Debian/Ubuntu: apt-get install nlohmann-json3-dev libcli11-dev)")
    for src, _ in items[2:]:
        if not src.is_file():
            raise InternalError(f"{src} not found: the apache-tvm-ffi wheel is incomplete")
    ort, _why = ort_headers()
    if ort is not None:
        items.append((ort, "onnxruntime"))
    for deb in ("nlohmann-json3-dev", "libcli11-dev"):
        copyright_file = Path("/usr/share/doc") / deb / "copyright"
        if copyright_file.is_file():
            items.append((copyright_file, f"licenses/{deb}.copyright"))
    return items


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def _source_hash() -> str:
    h = hashlib.sha256()
    src = data_dir("runtime_cpp")
    for p in _files(src):
        h.update(str(p.relative_to(src)).encode())
        h.update(p.read_bytes())
    for item, dest in _third_party():
        for p in ([item] if item.is_file() else _files(item)):
            h.update(dest.encode() + str(p.name).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def staged_sources() -> Path:
    """The runtime source tree with third_party/ filled in (cached, built once per hash)."""
    root = cache_dir() / "runtime" / f"src-{_source_hash()}"
    done = root.with_suffix(".complete")           # beside the tree: the tree is copied into packages
    if done.exists():
        return root
    with locked(root.with_suffix(".lock")):
        if done.exists():
            return root
        tmp = root.with_name(root.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        with filling(tmp, root):
            shutil.copytree(data_dir("runtime_cpp"), tmp, ignore=shutil.ignore_patterns("__pycache__", "build"))
            tp = tmp / "third_party"
            for src, dest in _third_party():
                target = tp / dest
                target.parent.mkdir(parents=True, exist_ok=True)
                (shutil.copytree if src.is_dir() else shutil.copy2)(src, target)
            (tp / "README.md").write_text(THIRD_PARTY_LICENSES)
            shutil.rmtree(root, ignore_errors=True)
            tmp.rename(root)
            done.write_text("ok\n")
    return root


def _compiler_id(tc: Toolchain) -> str:
    out = subprocess.run([tc.cxx, "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0] if out else tc.cxx


def build_runtime(arch: str, log=None) -> Path:
    """Install tree (bin/packrt-run, bin/packrt-example, lib/libpackrt.{so,a}, include/) for `arch`."""
    tc = Toolchain.for_arch(arch)
    if shutil.which("cmake") is None:
        raise UserError("cmake not found on PATH; install it (Debian/Ubuntu: apt-get install cmake)")
    src = staged_sources()
    key = hashlib.sha256(f"{src.name}|{arch}|{_compiler_id(tc)}".encode()).hexdigest()[:16]
    root = cache_dir() / "runtime" / f"{arch}-{key}"
    install, done = root / "install", root.with_suffix(".complete")
    if done.exists():
        return install
    with locked(root.with_suffix(".lock")):
        if done.exists():
            return install
        if log:
            log(f"building the C++ runtime for {arch} (once; cached in {root})")
        shutil.rmtree(root, ignore_errors=True)
        build = root / "build"
        cfg = ["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
               f"-DCMAKE_INSTALL_PREFIX={install}"]
        if arch != host_arch():
            cfg.append(f"-DCMAKE_TOOLCHAIN_FILE={src / 'cmake' / f'{arch}-linux-gnu.cmake'}")
        steps = [cfg, ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)],
                 ["cmake", "--install", str(build)]]
        with filling(root):
            for cmd in steps:
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-25:])
                    raise InternalError(f"building the C++ runtime for {arch} failed: {' '.join(cmd[:3])} ...\n"
                                        f"{tail}")
            shutil.rmtree(build, ignore_errors=True)
            done.write_text("ok\n")
    return install


def bundle_runtimes(w, runtimes: dict[str, Path]) -> tuple[dict, dict]:
    """Runtime binaries per architecture, the sources, and the ORT library per architecture."""
    w.copytree(staged_sources(), "runtime/src")
    runtime, ort_libs = {}, {}
    for arch, install in runtimes.items():
        dest = w.copytree(install, f"runtime/{arch}")
        runtime[arch] = {"cli": f"runtime/{arch}/bin/packrt-run", "library": f"runtime/{arch}/lib/libpackrt.so",
                         "static_library": f"runtime/{arch}/lib/libpackrt.a",
                         "example": f"runtime/{arch}/bin/packrt-example", "include": f"runtime/{arch}/include"}
        lib = dest / "lib" / ORT_LIBRARY
        if lib.is_file():
            w.path(f"ort/{arch}")
            shutil.move(lib, w.path(f"ort/{arch}/{ORT_LIBRARY}"))
            ort_libs[arch] = f"ort/{arch}/{ORT_LIBRARY}"
    return runtime, ort_libs
