"""The runtime built with AddressSanitizer + UndefinedBehaviorSanitizer, cached per source hash."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path


REPO = Path(__file__).resolve().parents[3]

# --------------------------------------------------------------------------------------------
# The sanitized runtime
# --------------------------------------------------------------------------------------------

# float-cast-overflow is not part of GCC's -fsanitize=undefined; it catches JSON 1e300 -> int.
SANITIZE = "-fsanitize=address,undefined,float-cast-overflow"
SANITIZE_CFLAGS = f"{SANITIZE} -fno-omit-frame-pointer -g"
# Any report makes a nonzero exit and shows on stderr. allocator_may_return_null: a failed huge
# allocation returns NULL (std::bad_alloc) as with glibc, instead of an ASan report, so the
# sanitized run behaves like the shipped one there.
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:allocator_may_return_null=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and not {"__pycache__", "build"} & set(p.relative_to(root).parts):
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def build_sanitized_runtime(source: Path | None = None, cache: Path | None = None, log=None) -> Path:
    """packrt-run (and libpackrt) from the repository's runtime_cpp/, built with ASan + UBSan
    (PACKRT_STATIC_LIBSTDCXX off: ASan needs the shared libstdc++). Cached per source hash under
    the packager cache (or `cache`). Returns the packrt-run executable."""
    from packager.cache import cache_dir, locked
    from packager.emit.runtime import staged_sources

    src = source or REPO / "runtime_cpp"
    third_party = staged_sources() / "third_party"      # nlohmann, CLI11, tvm-ffi + dlpack headers
    cxx = subprocess.run(["c++", "--version"], capture_output=True, text=True, check=False).stdout.split("\n")[0]
    key = hashlib.sha256(f"{_tree_hash(src)}|{third_party}|{SANITIZE_CFLAGS}|{cxx}".encode()).hexdigest()[:16]
    root = (cache or cache_dir() / "runtime") / f"sanitized-x86_64-{key}"
    exe, done = root / "build" / "packrt-run", root.with_suffix(".complete")
    if done.exists() and exe.is_file():
        return exe
    with locked(root.with_suffix(".lock")):
        if done.exists() and exe.is_file():
            return exe
        if log:
            log(f"building the sanitized runtime from {src} (once; cached in {root})")
        shutil.rmtree(root, ignore_errors=True)
        build = root / "build"
        cfg = ["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
               f"-DPACKRT_THIRD_PARTY_DIR={third_party}", "-DPACKRT_STATIC_LIBSTDCXX=OFF",
               "-DPACKRT_BUILD_EXAMPLES=OFF", f"-DCMAKE_C_FLAGS={SANITIZE_CFLAGS}",
               f"-DCMAKE_CXX_FLAGS={SANITIZE_CFLAGS}", f"-DCMAKE_EXE_LINKER_FLAGS={SANITIZE}",
               f"-DCMAKE_SHARED_LINKER_FLAGS={SANITIZE}"]
        jobs = str(min(os.cpu_count() or 2, 8))
        for cmd in (cfg, ["cmake", "--build", str(build), "-j", jobs, "--target", "packrt-run", "packrt"]):
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"building the sanitized runtime failed: {' '.join(cmd[:4])} ...\n"
                                   + "\n".join((r.stdout + r.stderr).strip().splitlines()[-30:]))
        done.write_text("ok\n")
    return exe

