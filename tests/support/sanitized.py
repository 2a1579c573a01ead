"""The runtime (runtime_cpp/) built with a sanitizer, cached per source hash and build flags.

    build_sanitized_runtime("address")  ASan + UBSan: packrt-run and libpackrt (the malformed-package
                                        runner runs this packrt-run); returns packrt-run
    build_sanitized_runtime("thread")   TSan: libpackrt only (a test program linked with -fsanitize=thread
                                        drives the C API); returns libpackrt.so

Each build lives in its own folder of the packager cache, sanitized-<sanitizer>-<arch>-<key>, where
the key hashes the runtime sources, the third-party headers' folder, the cmake settings (flags,
targets) and the compiler version.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Sanitizer:
    compile_flags: str      # CMAKE_C_FLAGS / CMAKE_CXX_FLAGS
    link_flags: str         # CMAKE_EXE_LINKER_FLAGS / CMAKE_SHARED_LINKER_FLAGS
    build_type_flags: bool  # keep RelWithDebInfo's own flags (-O2 -g -DNDEBUG); False: compile_flags alone
    targets: tuple[str, ...]
    product: str            # the file (in the build folder) build_sanitized_runtime returns


# float-cast-overflow is not part of GCC's -fsanitize=undefined; it catches JSON 1e300 -> int.
SANITIZE = "-fsanitize=address,undefined,float-cast-overflow"
SANITIZE_CFLAGS = f"{SANITIZE} -fno-omit-frame-pointer -g"
TSAN_CFLAGS = "-fsanitize=thread -fno-omit-frame-pointer -g -O1"

SANITIZERS = {
    "address": Sanitizer(SANITIZE_CFLAGS, SANITIZE, True, ("packrt-run", "packrt"), "packrt-run"),
    # only the shared library: the TSan test links its own driver against it
    "thread": Sanitizer(TSAN_CFLAGS, "-fsanitize=thread", False, ("packrt",), "libpackrt.so"),
}

# For the ASan + UBSan build: any report makes a nonzero exit and shows on stderr.
# allocator_may_return_null: a failed huge allocation returns NULL (std::bad_alloc) as with glibc,
# instead of an ASan report, so the sanitized run behaves like the shipped one there.
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


def _cmake_configure(src: Path, build: Path, third_party: Path, s: Sanitizer) -> list[str]:
    cmd = ["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
           f"-DPACKRT_THIRD_PARTY_DIR={third_party}", "-DPACKRT_STATIC_LIBSTDCXX=OFF",
           "-DPACKRT_BUILD_EXAMPLES=OFF", f"-DCMAKE_C_FLAGS={s.compile_flags}",
           f"-DCMAKE_CXX_FLAGS={s.compile_flags}", f"-DCMAKE_EXE_LINKER_FLAGS={s.link_flags}",
           f"-DCMAKE_SHARED_LINKER_FLAGS={s.link_flags}"]
    if not s.build_type_flags:   # RelWithDebInfo's -O2 would come after (and override) -O1
        cmd += ["-DCMAKE_C_FLAGS_RELWITHDEBINFO=", "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="]
    return cmd


def build_sanitized_runtime(sanitizer: str = "address", source: Path | None = None, cache: Path | None = None,
                            log=None) -> Path:
    """The runtime from the repository's runtime_cpp/ (or `source`) built with `sanitizer`
    ("address": ASan + UBSan, "thread": TSan; see SANITIZERS), PACKRT_STATIC_LIBSTDCXX off (the
    sanitizers need the shared libstdc++). Cached under the packager cache (or `cache`). Returns the
    sanitizer's product: packrt-run ("address") or libpackrt.so ("thread"), in the build folder."""
    from packager.cache import cache_dir, locked
    from packager.emit.runtime import staged_sources

    if sanitizer not in SANITIZERS:
        raise ValueError(f"unknown sanitizer {sanitizer!r}: one of {', '.join(SANITIZERS)}")
    s = SANITIZERS[sanitizer]
    src = source or REPO / "runtime_cpp"
    third_party = staged_sources() / "third_party"      # nlohmann, CLI11, tvm-ffi + dlpack headers
    cxx = subprocess.run(["c++", "--version"], capture_output=True, text=True, check=False).stdout.split("\n")[0]
    cfg_marker = _cmake_configure(Path("SRC"), Path("BUILD"), third_party, s)
    key = hashlib.sha256(f"{_tree_hash(src)}|{cfg_marker}|{s.targets}|{cxx}".encode()).hexdigest()[:16]
    root = (cache or cache_dir() / "runtime") / f"sanitized-{sanitizer}-{platform.machine()}-{key}"
    product, done = root / "build" / s.product, root.with_suffix(".complete")
    if done.exists() and product.is_file():
        return product
    with locked(root.with_suffix(".lock")):
        if done.exists() and product.is_file():
            return product
        if log:
            log(f"building the {sanitizer}-sanitized runtime from {src} (once; cached in {root})")
        shutil.rmtree(root, ignore_errors=True)
        build = root / "build"
        jobs = str(min(os.cpu_count() or 2, 8))
        for cmd in (_cmake_configure(src, build, third_party, s),
                    ["cmake", "--build", str(build), "-j", jobs, "--target", *s.targets]):
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"building the {sanitizer}-sanitized runtime failed: {' '.join(cmd[:4])} ...\n"
                                   + "\n".join((r.stdout + r.stderr).strip().splitlines()[-30:]))
        done.write_text("ok\n")
    return product
