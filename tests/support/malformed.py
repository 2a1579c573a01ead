"""Malformed packages for packrt-run: a generator of damaged copies of a built package, a runner
that classifies how the runtime takes each one, and a sanitized (ASan + UBSan) build of the runtime.

Every variant is (name, defect class, a function that damages a copy of the package). After the
damage the copy's manifest is re-signed (sha256 and bytes of every changed file recomputed) so the
checksum check passes and what is tested is the loader's own validation; a few variants stay
unsigned to show that tampering is detected. Some variants damage the .npy input instead, or give
packrt-run a bad option.

Outcomes (see `classify`): clean (exit 2, or 1, with exactly one stderr line starting
"packrt-run: error:"), correct (exit 0, outputs equal the undamaged package's), wrong (exit 0,
outputs differ or are missing), crash (killed by a signal), hang (timeout), sanitizer (an ASan or
UBSan report), messy (any other failure). A runtime that takes malformed packages well gives only
clean and correct.

The runner copies the package without runtime/ and ort/ (packrt-run reads neither) and runs the
given packrt-run (the sanitized build, or the package's own) with the copy as its argument.
Variants marked `native` (huge --threads) run the package's own binary under RLIMIT_AS (ASan
cannot run under an address-space limit): an uncapped thread pool then fails after a few hundred
threads instead of taking every pid of the machine.

By hand (the package's own packrt-run, or the sanitized one with --sanitized):
    PYTHONPATH=. python tests/support/malformed.py --sanitized --table malformed.md PKG
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]

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


# --------------------------------------------------------------------------------------------
# Variants
# --------------------------------------------------------------------------------------------

CLASSES = {
    "ranges": "plan.json offsets/sizes negative, huge, wrapping, overlapping, misaligned; arena and weights bytes",
    "dtypes": "tensor dtypes unknown, or not matching their bytes or what the kernel takes",
    "json-types": "missing keys, extra keys, JSON values of the wrong type (strings, floats, booleans, 2^32, 1e300, null)",
    "kernels": "kernel symbols (libc functions, data, other kernels), kernel and tensor indices, argument counts",
    "shapes": "zero, negative and overflowing dimensions, rank above the maximum",
    "truncated": "truncated and zero-length package files",
    "filesystem": "symlinks, FIFOs and directories in place of files, '..' and absolute manifest paths",
    "copy-steps": "copy steps: overlapping ranges, into weights or inputs, between different sizes",
    "npy-input": "damaged .npy inputs (the package is intact)",
    "threads": "bad --threads values",
    "manifest": "manifest.json: wrong types, missing targets, unknown devices, unsigned tampering",
}

U64 = 2**64
INT_MIN = -2**31


def host_target(manifest: dict) -> dict:
    """The manifest's CPU target for this machine."""
    arch = os.uname().machine
    for t in manifest["targets"]:
        if t.get("kind") == "cpu" and t.get("arch") == arch:
            return t
    raise ValueError(f"the package has no CPU target for {arch}")


@dataclass
class Case:
    """One variant's world: the package copy it damages, a scratch folder outside the package,
    and what packrt-run is given."""
    pkg: Path
    work: Path
    inputs: dict[str, Path]
    rel: dict[str, str]                 # "plan", "kernels", "weights" -> path in the package
    threads: str = "2"
    package_arg: Path | None = None     # what packrt-run gets as the package (default: pkg)

    def file(self, key: str) -> Path:
        return self.pkg / self.rel[key]

    def manifest(self) -> dict:
        return json.loads((self.pkg / "manifest.json").read_text())

    def write_manifest(self, m) -> None:
        (self.pkg / "manifest.json").write_text(json.dumps(m, indent=1))

    def edit_manifest(self, fn: Callable[[dict], None]) -> None:
        m = self.manifest()
        fn(m)
        self.write_manifest(m)

    def target(self, m: dict) -> dict:
        return next(t for t in m["targets"] if t.get("plan") == self.rel["plan"])

    def plan(self) -> dict:
        return json.loads(self.file("plan").read_text())

    def edit_plan(self, fn: Callable[[dict], None]) -> None:
        p = self.plan()
        fn(p)
        self.file("plan").write_text(json.dumps(p, indent=1))

    def input_array(self) -> tuple[str, np.ndarray]:
        name, path = next(iter(self.inputs.items()))
        return name, np.load(path)

    def replace_input(self, data: bytes) -> None:
        name = next(iter(self.inputs))
        p = self.work / "input.npy"
        p.write_bytes(data)
        self.inputs = {**self.inputs, name: p}


@dataclass(frozen=True)
class Variant:
    name: str
    cls: str
    mutate: Callable[[Case], None]
    sign: bool = True      # re-sign the manifest after the damage
    native: bool = False   # run the package's own packrt-run under an address-space limit (not the sanitized one)


# --- plan selectors (on the first profile) ---

def _in(pr) -> int:
    return pr["inputs"][0]["tensor"]


def _out(pr) -> int:
    return pr["outputs"][0]["tensor"]


def _step0(pr) -> dict:
    return next(s for s in pr["steps"] if s["op"] == "kernel")


def _produced(pr) -> int:
    """The first kernel's output: an arena tensor that a later kernel reads."""
    return _step0(pr)["args"][-1]


def _written(k: int):
    """The output of the k-th kernel step (an intermediate: inputs and outputs are bound to the
    caller's buffers, so moving them inside the arena changes nothing)."""
    return lambda pr: [s for s in pr["steps"] if s["op"] == "kernel"][k]["args"][-1]


def _weights(k: int):
    return lambda pr: [i for i, t in enumerate(pr["tensors"]) if t["storage"] == "weights"][k]


def _align(n: int) -> int:
    return (n + 63) // 64 * 64


def _dsize(dtype: str) -> int:
    return {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "int16": 2}.get(dtype, 1)


def _wrapping_shape(shape: list[int], dsize: int) -> list[int]:
    """`shape` with one dimension grown so that the byte count dsize * prod(shape) is unchanged
    modulo 2^64 (the grown dimension still fits int64)."""
    for i in reversed(range(len(shape))):
        m = dsize * int(np.prod([d for j, d in enumerate(shape) if j != i], dtype=object))
        if m and m & (m - 1) == 0 and shape[i] + U64 // m < 2**63:
            return shape[:i] + [shape[i] + U64 // m] + shape[i + 1:]
    raise ValueError(f"no wrapping shape for {shape}")


# --- mutation builders ---

def on_plan(fn: Callable[[dict], None]) -> Callable[[Case], None]:
    return lambda c: c.edit_plan(fn)


def on_profile(fn: Callable[[dict], None]) -> Callable[[Case], None]:
    return on_plan(lambda p: fn(p["profiles"][0]))


def set_tensor(sel: Callable[[dict], int], **changes) -> Callable[[Case], None]:
    """Changes fields of tensor sel(profile); a callable value is called with (tensor, profile)."""
    def f(pr):
        t = pr["tensors"][sel(pr)]
        for k, v in changes.items():
            t[k] = v(t, pr) if callable(v) else v
    return on_profile(f)


def del_key(path: Callable[[dict], dict], key: str) -> Callable[[Case], None]:
    return on_plan(lambda p: path(p).pop(key))


def set_step0(**changes) -> Callable[[Case], None]:
    def f(p):
        pr = p["profiles"][0]
        s = _step0(pr)
        for k, v in changes.items():
            s[k] = v(s, p) if callable(v) else v
    return on_plan(f)


def set_kernel0(**changes) -> Callable[[Case], None]:
    """Changes fields of the kernel that the first step calls."""
    def f(p):
        k = p["kernels"][_step0(p["profiles"][0])["kernel"]]
        for key, v in changes.items():
            k[key] = v(k, p) if callable(v) else v
    return on_plan(f)


def _other_kernel(p: dict, same_arity: bool) -> int:
    k0 = _step0(p["profiles"][0])["kernel"]
    n = p["kernels"][k0]["num_args"]
    return next(i for i, k in enumerate(p["kernels"]) if i != k0 and (k["num_args"] == n) == same_arity)


def _replace_arg(pos: int, value):
    def f(s, p):
        args = list(s["args"])
        args[pos] = value(args, p) if callable(value) else value
        return args
    return f


def _drop_last_arg(p: dict) -> None:
    k0 = _step0(p["profiles"][0])["kernel"]
    p["kernels"][k0]["num_args"] -= 1
    for prof in p["profiles"]:
        for s in prof["steps"]:
            if s["op"] == "kernel" and s["kernel"] == k0:
                s["args"] = s["args"][:-1]


def _cuda_plan(launch_args: list[int]) -> Callable[[dict], None]:
    def f(p):
        p["device"], p["module"] = "cuda", "kernels.fatbin"
        for k in p["kernels"]:
            k["workspace"] = []
            k["launches"] = [{"function": k["name"], "args": launch_args, "grid": [1, 1, 1], "block": [32, 1, 1]}]
    return f


def _new_tensor(pr: dict, like: int, storage: str = "arena", offset: int | None = None) -> int:
    """A new tensor shaped like `like`: at the end of the arena unless `offset` is given."""
    t = dict(pr["tensors"][like], storage=storage)
    if offset is None:
        offset = _align(pr["arena_bytes"])
    t["offset"] = offset
    if storage == "arena":
        pr["arena_bytes"] = max(pr["arena_bytes"], _align(offset + t["bytes"]))
    pr["tensors"].append(t)
    return len(pr["tensors"]) - 1


def _copy_valid(pr):
    n = _new_tensor(pr, _out(pr))
    pr["steps"].append({"op": "copy", "args": [_out(pr), n]})
    pr["outputs"][0]["tensor"] = n


def _copy_overlapping(pr):
    src = _produced(pr)
    dst = _new_tensor(pr, src, offset=pr["tensors"][src]["offset"] + 64)
    pr["steps"].append({"op": "copy", "args": [src, dst]})


def _copy_into_new_weights(pr):
    w = _new_tensor(pr, _in(pr), storage="weights", offset=0)
    pr["steps"].insert(0, {"op": "copy", "args": [_in(pr), w]})


def _copy_into_weights(pr):
    w = _weights(0)(pr)
    a = _new_tensor(pr, w)
    pr["steps"].insert(0, {"op": "copy", "args": [a, w]})


def _copy_into_input(pr):
    a = _new_tensor(pr, _in(pr))
    pr["steps"].insert(0, {"op": "copy", "args": [a, _in(pr)]})


def append_step(step: Callable[[dict], dict]) -> Callable[[Case], None]:
    return on_profile(lambda pr: pr["steps"].append(step(pr)))


def cut(key: str, frac: float | None = None, keep: int | None = None) -> Callable[[Case], None]:
    def f(c):
        p = c.pkg / "manifest.json" if key == "manifest" else c.file(key)
        data = p.read_bytes()
        p.write_bytes(data[:keep if keep is not None else int(len(data) * frac)])
    return f


def append_bytes(key: str, extra: bytes) -> Callable[[Case], None]:
    def f(c):
        with open(c.file(key), "ab") as fh:
            fh.write(extra)
    return f


def symlink_inside(key: str) -> Callable[[Case], None]:
    def f(c):
        p = c.file(key)
        real = p.with_name(p.name + ".real")
        p.rename(real)
        p.symlink_to(real.name)
    return f


def symlink_outside(key: str, to: str | None = None) -> Callable[[Case], None]:
    def f(c):
        p = c.file(key)
        if to is None:
            outside = c.work / p.name
            shutil.move(p, outside)
        else:
            outside = Path(to)
            p.unlink()
        p.symlink_to(outside)
    return f


def symlink_loop(key: str) -> Callable[[Case], None]:
    def f(c):
        p = c.file(key)
        p.unlink()
        p.symlink_to(p.name)
    return f


def fifo(key: str) -> Callable[[Case], None]:
    def f(c):
        p = c.pkg / "manifest.json" if key == "manifest" else c.file(key)
        p.unlink()
        os.mkfifo(p)
    return f


def directory(key: str) -> Callable[[Case], None]:
    def f(c):
        p = c.pkg / "manifest.json" if key == "manifest" else c.file(key)
        p.unlink()
        p.mkdir()
        (p / "x").write_text("x")
    return f


def manifest_path(key: str, new: Callable[[Case], str]) -> Callable[[Case], None]:
    """Points the target's `key` file at another path (and lists that path in `files`)."""
    def f(c):
        m = c.manifest()
        path = new(c)
        m["files"][path] = dict(m["files"][c.rel[key]])
        c.target(m)[key] = path
        c.write_manifest(m)
    return f


def _abs_copy_outside(key: str):
    def f(c):
        outside = c.work / ("outside-" + c.file(key).name)
        shutil.copy(c.file(key), outside)
        return str(outside)
    return f


def _package_through_symlink(c: Case) -> None:
    link = c.work / "package-link"
    link.symlink_to(c.pkg, target_is_directory=True)
    c.package_arg = link


def on_manifest(fn: Callable[[dict, Case], None]) -> Callable[[Case], None]:
    return lambda c: c.edit_manifest(lambda m: fn(m, c))


def on_target(**changes) -> Callable[[Case], None]:
    def f(m, c):
        t = c.target(m)
        for k, v in changes.items():
            t[k] = v
    return on_manifest(f)


def write_text(key: str, text: str) -> Callable[[Case], None]:
    def f(c):
        p = c.pkg / "manifest.json" if key == "manifest" else c.file(key)
        p.write_text(text)
    return f


def flip_byte(key: str, at: int = 100) -> Callable[[Case], None]:
    def f(c):
        p = c.file(key)
        data = bytearray(p.read_bytes())
        data[at] ^= 0x40
        p.write_bytes(bytes(data))
    return f


# --- .npy inputs ---

def npy_bytes(header: str, data: bytes = b"", version: int = 1, hlen: int | None = None, pad: bool = True) -> bytes:
    """A .npy file with a hand-written header dict (padded like numpy's, ending in a newline, if `pad`)."""
    h = header.encode("latin1")
    pre = 8 + (2 if version == 1 else 4)
    if pad:
        h += b" " * ((64 - (pre + len(h) + 1) % 64) % 64) + b"\n"
    n = len(h) if hlen is None else hlen
    size = n.to_bytes(2 if version == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([version, 0]) + size + h + data


def npy_input(header: Callable[[np.ndarray], str], data: Callable[[np.ndarray], bytes] = lambda x: x.tobytes(),
              **kw) -> Callable[[Case], None]:
    def f(c):
        _, x = c.input_array()
        c.replace_input(npy_bytes(header(x), data(x), **kw))
    return f


def _hdr(shape: str, descr: str = "<f4", fortran: str = "False") -> str:
    return f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}"


def _shape(x: np.ndarray) -> str:
    return "(" + ", ".join(map(str, x.shape)) + ("," if x.ndim == 1 else "") + ")"


def npy_raw(data: Callable[[np.ndarray], bytes]) -> Callable[[Case], None]:
    def f(c):
        _, x = c.input_array()
        c.replace_input(data(x))
    return f


def _npy_saved(x: np.ndarray) -> bytes:
    import io
    b = io.BytesIO()
    np.save(b, x)
    return b.getvalue()


def threads(value: str) -> Callable[[Case], None]:
    def f(c):
        c.threads = value
    return f


def variants() -> list[Variant]:
    """Every variant, in table order."""
    out: list[Variant] = []

    def add(name: str, cls: str, fn: Callable[[Case], None], **kw) -> None:
        assert cls in CLASSES, cls
        out.append(Variant(name, cls, fn, **kw))

    # (1) byte ranges in plan.json
    c = "ranges"
    add("offset-negative-64", c, set_tensor(_produced, offset=-64))
    add("offset-2^63", c, set_tensor(_produced, offset=2**63))
    add("offset-2^64-4096-wraps", c, set_tensor(_produced, offset=U64 - 4096))
    add("offset-2^64-1", c, set_tensor(_produced, offset=U64 - 1))
    add("weights-offset-2^64-64-wraps", c, set_tensor(_weights(0), offset=U64 - 64))
    add("offset-at-arena-end", c, set_tensor(_produced, offset=lambda t, pr: _align(pr["arena_bytes"])))
    add("offset-misaligned", c, set_tensor(_produced, offset=lambda t, pr: t["offset"] + 4))
    add("weights-offset-misaligned", c, set_tensor(_weights(1), offset=lambda t, pr: t["offset"] + 32))
    add("bytes-2^63", c, set_tensor(_produced, bytes=2**63))
    add("bytes-2^64-1", c, set_tensor(_produced, bytes=U64 - 1))
    add("bytes-negative", c, set_tensor(_produced, bytes=-4))
    add("overlap-output-on-live-input", c,           # the second kernel writes over what it reads
        set_tensor(_written(1), offset=lambda t, pr: pr["tensors"][_written(0)(pr)]["offset"]))
    add("overlap-two-weights", c, set_tensor(_weights(1), offset=lambda t, pr: pr["tensors"][_weights(0)(pr)]["offset"]))
    add("arena-bytes-negative", c, on_profile(lambda pr: pr.update(arena_bytes=-1)))
    add("arena-bytes-2^64-1", c, on_profile(lambda pr: pr.update(arena_bytes=U64 - 1)))
    add("arena-bytes-2^64-64", c, on_profile(lambda pr: pr.update(arena_bytes=U64 - 64)))
    add("arena-bytes-2^63", c, on_profile(lambda pr: pr.update(arena_bytes=2**63)))
    add("arena-bytes-0", c, on_profile(lambda pr: pr.update(arena_bytes=0)))
    add("arena-bytes-too-small", c, on_profile(lambda pr: pr.update(arena_bytes=pr["arena_bytes"] - 64)))
    add("weights-bytes-negative", c, on_plan(lambda p: p["weights"].update(bytes=-1)))
    add("weights-bytes-2^64-1", c, on_plan(lambda p: p["weights"].update(bytes=U64 - 1)))
    add("weights-bytes-2^63", c, on_plan(lambda p: p["weights"].update(bytes=2**63)))
    add("weights-bytes-larger-than-file", c, on_plan(lambda p: p["weights"].update(bytes=p["weights"]["bytes"] + 64)))

    # (2) dtypes
    c = "dtypes"
    add("dtype-unknown", c, set_tensor(_produced, dtype="float128"))
    add("dtype-empty", c, set_tensor(_produced, dtype=""))
    add("dtype-uppercase", c, set_tensor(_produced, dtype="FLOAT32"))
    add("dtype-float64-bytes-of-float32", c, set_tensor(_in, dtype="float64"))
    add("dtype-int32-intermediate", c, set_tensor(_produced, dtype="int32"))
    add("dtype-float16-intermediate", c, set_tensor(_produced, dtype="float16", bytes=lambda t, pr: t["bytes"] // 2))
    add("dtype-int32-input", c, set_tensor(_in, dtype="int32"))
    add("dtype-int8-output", c, set_tensor(_out, dtype="int8", shape=lambda t, pr: [1, t["bytes"]]))
    add("dtype-bool-weights", c, set_tensor(_weights(0), dtype="bool", shape=lambda t, pr: [t["bytes"]]))

    # (3) JSON: missing keys, extra keys, wrong types
    c = "json-types"
    add("offset-string", c, set_tensor(_produced, offset="0"))
    add("offset-null", c, set_tensor(_produced, offset=None))
    add("offset-float-0.75", c, set_tensor(_written(1), offset=0.75))
    add("offset-true", c, set_tensor(_produced, offset=True))
    add("offset-2^64-as-float", c, set_tensor(_produced, offset=float(U64)))
    add("offset-1e300", c, set_tensor(_produced, offset=1e300))
    add("offset-nan", c, set_tensor(_produced, offset=float("nan")))
    add("arena-bytes-1e300", c, on_profile(lambda pr: pr.update(arena_bytes=1e300)))
    add("kernel-index-2^32-plus-other", c, set_step0(kernel=lambda s, p: 2**32 + _other_kernel(p, True)))
    add("kernel-index-1e300", c, set_step0(kernel=1e300))
    add("kernel-index-true", c, set_step0(kernel=True))
    add("step-arg-2^32-plus-input", c, set_step0(args=_replace_arg(-1, lambda a, p: 2**32 + _in(p["profiles"][0]))))
    add("step-arg-true", c, set_step0(args=_replace_arg(0, True)))
    add("num-args-float", c, set_kernel0(num_args=lambda k, p: k["num_args"] + 0.5))
    add("io-tensor-string", c, on_profile(lambda pr: pr["inputs"][0].update(tensor=str(_in(pr)))))
    add("shape-strings", c, set_tensor(_in, shape=lambda t, pr: [str(d) for d in t["shape"]]))
    add("shape-float-dim", c, set_tensor(_in, shape=lambda t, pr: t["shape"][:-1] + [t["shape"][-1] + 0.5]))
    add("dtype-number", c, set_tensor(_produced, dtype=1))
    add("plan-version-string", c, on_plan(lambda p: p.update(version="1")))
    add("plan-version-true", c, on_plan(lambda p: p.update(version=True)))
    add("missing-format", c, del_key(lambda p: p, "format"))
    add("missing-weights", c, del_key(lambda p: p, "weights"))
    add("missing-kernels", c, del_key(lambda p: p, "kernels"))
    add("missing-tensor-offset", c, del_key(lambda p: p["profiles"][0]["tensors"][_produced(p["profiles"][0])], "offset"))
    add("missing-profile-steps", c, del_key(lambda p: p["profiles"][0], "steps"))
    add("missing-kernel-symbol", c, del_key(lambda p: p["kernels"][0], "symbol"))

    def extra_keys(p):
        p["unexpected"] = {"a": [1, 2]}
        p["kernels"][0]["unexpected"] = True
        p["profiles"][0]["unexpected"] = None
        p["profiles"][0]["tensors"][0]["unexpected"] = "x"
        p["profiles"][0]["steps"][0]["unexpected"] = 1.5
    add("extra-keys-everywhere", c, on_plan(extra_keys))
    add("weights-array-for-object", c, on_plan(lambda p: p.update(weights=[p["weights"]["bytes"]])))
    add("profiles-object-for-array", c, on_plan(lambda p: p.update(profiles={"default": p["profiles"][0]})))
    add("tensor-array-for-object", c,
        on_profile(lambda pr: pr["tensors"].__setitem__(_produced(pr), list(pr["tensors"][_produced(pr)].values()))))
    add("plan-is-json-array", c, write_text("plan", "[]"))
    add("plan-not-json", c, write_text("plan", "{\"format\": \"packager-plan\", "))

    # (4) kernels: symbols, indices, argument counts
    c = "kernels"
    add("symbol-exit", c, set_kernel0(symbol="exit"))
    add("symbol-abort", c, set_kernel0(symbol="abort"))
    add("symbol-malloc", c, set_kernel0(symbol="malloc"))
    add("symbol-data-hook-variable", c, set_kernel0(symbol="__TVMBackendAllocWorkspace"))
    add("symbol-bss-variable", c, set_kernel0(symbol="packrt_parallel_barrier"))
    add("symbol-libc-data-environ", c, set_kernel0(symbol="environ"))
    add("symbol-missing", c, set_kernel0(symbol="no_such_kernel"))
    add("symbol-empty", c, set_kernel0(symbol=""))
    add("symbol-abi-version-function", c, set_kernel0(symbol="packrt_kernels_abi_version"))
    add("symbol-ffi-helper-function", c, set_kernel0(symbol="TVMFFIErrorSetRaisedFromCStr"))
    add("symbol-of-other-kernel-other-arity", c,
        set_kernel0(symbol=lambda k, p: p["kernels"][_other_kernel(p, False)]["symbol"]))
    add("symbol-of-other-kernel-same-arity", c,
        set_kernel0(symbol=lambda k, p: p["kernels"][_other_kernel(p, True)]["symbol"]))
    add("kernel-name-multiline-and-failing", c,
        set_kernel0(name="conv\nsecond line", symbol=lambda k, p: p["kernels"][_other_kernel(p, False)]["symbol"]))
    add("step-arg-negative", c, set_step0(args=_replace_arg(0, -1)))
    add("step-arg-int-max", c, set_step0(args=_replace_arg(0, 2**31 - 1)))
    add("step-arg-2^63", c, set_step0(args=_replace_arg(-1, 2**63)))
    add("num-args-plus-one", c, set_kernel0(num_args=lambda k, p: k["num_args"] + 1))
    add("num-args-and-args-minus-one", c, on_plan(_drop_last_arg))
    add("kernel-index-negative", c, set_step0(kernel=-1))
    add("kernel-index-past-end", c, set_step0(kernel=lambda s, p: len(p["kernels"])))
    add("step-op-unknown", c, set_step0(op="launch"))
    add("cuda-plan-launch-arg-int-min", c, on_plan(_cuda_plan([INT_MIN])))
    add("cuda-plan-on-cpu-target", c, on_plan(_cuda_plan([0])))

    # (5) shapes
    c = "shapes"
    add("dim-zero-intermediate", c, set_tensor(_produced, shape=lambda t, pr: [t["shape"][0], 0, *t["shape"][2:]], bytes=0))
    add("dim-negative", c, set_tensor(_produced, shape=lambda t, pr: [t["shape"][0], -t["shape"][1], *t["shape"][2:]]))
    add("dims-2^32x2^32-intermediate", c, set_tensor(_produced, shape=[2**32, 2**32], bytes=0))
    add("dims-2^32x2^32-output", c, set_tensor(_out, shape=[2**32, 2**32], bytes=0))
    add("dims-2^32x2^32-input", c, set_tensor(_in, shape=[2**32, 2**32], bytes=0))
    add("dims-wrap-to-bytes-intermediate", c,
        set_tensor(_produced, shape=lambda t, pr: _wrapping_shape(t["shape"], _dsize(t["dtype"]))))
    add("dims-wrap-to-bytes-output", c, set_tensor(_out, shape=lambda t, pr: _wrapping_shape(t["shape"], _dsize(t["dtype"]))))
    add("rank-9", c, set_tensor(_produced, shape=lambda t, pr: [1] * (9 - len(t["shape"])) + t["shape"]))
    add("rank-0-output", c, set_tensor(_out, shape=[], bytes=lambda t, pr: _dsize(t["dtype"])))
    add("dim-2^63-1-input", c, set_tensor(_in, shape=lambda t, pr: [2**63 - 1, *t["shape"][1:]]))
    add("dim-2^64-1", c, set_tensor(_produced, shape=lambda t, pr: [U64 - 1, *t["shape"][1:]]))

    # (6) truncated and empty files
    c = "truncated"
    add("kernels-cut-to-10pct", c, cut("kernels", 0.10))
    add("kernels-cut-to-50pct", c, cut("kernels", 0.50))
    add("kernels-cut-to-90pct", c, cut("kernels", 0.90))
    add("kernels-elf-header-only", c, cut("kernels", keep=64))
    add("kernels-empty", c, cut("kernels", keep=0))
    add("kernels-garbage-appended", c, append_bytes("kernels", b"\xde\xad\xbe\xef" * 1000))
    add("plan-cut-in-half", c, cut("plan", 0.5))
    add("plan-empty", c, cut("plan", keep=0))
    add("weights-cut-in-half", c, cut("weights", 0.5))
    add("weights-empty", c, cut("weights", keep=0))
    add("manifest-cut-in-half", c, cut("manifest", 0.5), sign=False)
    add("manifest-empty", c, cut("manifest", keep=0), sign=False)

    # (7) the file system
    c = "filesystem"
    add("plan-symlink-inside", c, symlink_inside("plan"))
    add("plan-symlink-outside", c, symlink_outside("plan"))
    add("kernels-symlink-outside", c, symlink_outside("kernels"))
    add("weights-symlink-to-dev-zero", c, symlink_outside("weights", "/dev/zero"))
    add("plan-symlink-loop", c, symlink_loop("plan"))
    add("plan-fifo", c, fifo("plan"))
    add("weights-fifo", c, fifo("weights"))
    add("kernels-fifo", c, fifo("kernels"))
    add("manifest-fifo", c, fifo("manifest"), sign=False)
    add("plan-directory", c, directory("plan"))
    add("kernels-directory", c, directory("kernels"))
    add("manifest-directory", c, directory("manifest"), sign=False)
    add("plan-path-with-dotdot", c, manifest_path("plan", lambda c_: "targets/../" + c_.rel["plan"]))
    add("plan-path-absolute-inside", c, manifest_path("plan", lambda c_: str(c_.file("plan"))))
    add("weights-path-absolute-outside", c, manifest_path("weights", _abs_copy_outside("weights")))
    add("package-through-symlink", c, _package_through_symlink)

    # (8) copy steps (added to the plan: the samples' plans have none)
    c = "copy-steps"
    add("copy-valid-output", c, on_profile(_copy_valid))
    add("copy-overlapping-ranges", c, on_profile(_copy_overlapping))
    add("copy-onto-itself", c, append_step(lambda pr: {"op": "copy", "args": [_out(pr), _out(pr)]}))
    add("copy-into-new-weights-tensor", c, on_profile(_copy_into_new_weights))
    add("copy-into-existing-weights", c, on_profile(_copy_into_weights))
    add("copy-into-input", c, on_profile(_copy_into_input))
    add("copy-different-sizes", c, append_step(lambda pr: {"op": "copy", "args": [_in(pr), _out(pr)]}))
    add("copy-three-args", c, append_step(lambda pr: {"op": "copy", "args": [_out(pr), _out(pr), _out(pr)]}))
    add("copy-no-args", c, append_step(lambda pr: {"op": "copy", "args": []}))
    add("copy-index-out-of-range", c, append_step(lambda pr: {"op": "copy", "args": [_out(pr), len(pr["tensors"])]}))

    # (9) .npy inputs
    c = "npy-input"
    add("npy-negative-dim", c, npy_input(lambda x: _hdr("(-1, 1)")))
    add("npy-negative-dims-product-positive", c, npy_input(lambda x: _hdr("(-1, -3, 64, 64)")))
    add("npy-huge-dims-product-zero", c, npy_input(lambda x: _hdr("(1099511627776, 1099511627776)")))
    add("npy-dims-wrap-to-size", c,
        npy_input(lambda x: _hdr("(" + ", ".join(map(str, _wrapping_shape(list(x.shape), x.itemsize))) + ")")))
    add("npy-dim-beyond-int64", c, npy_input(lambda x: _hdr("(1000000000000000000000000000000,)")))
    add("npy-dim-not-a-number", c, npy_input(lambda x: _hdr("(1, 3, x, 64)")))
    add("npy-truncated-data", c, npy_input(lambda x: _hdr(_shape(x)), lambda x: x.tobytes()[: x.nbytes // 2]))
    add("npy-header-longer-than-file", c, npy_input(lambda x: _hdr(_shape(x)), lambda x: b"", hlen=60000))
    add("npy-header-without-shape", c, npy_input(lambda x: "{'descr': '<f4', 'fortran_order': False, }"))
    add("npy-header-ends-after-key", c, npy_input(lambda x: "{'descr':", lambda x: b""))
    add("npy-header-ends-after-colon-unpadded", c, npy_input(lambda x: "{'descr':          ", lambda x: b"", pad=False))
    add("npy-shape-unclosed", c, npy_input(lambda x: "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3, 64, 64"))
    add("npy-float64", c, npy_raw(lambda x: _npy_saved(x.astype(np.float64))))
    add("npy-big-endian", c, npy_raw(lambda x: _npy_saved(x.astype(">f4"))))
    add("npy-complex64", c, npy_raw(lambda x: _npy_saved(x.astype(np.complex64))))
    add("npy-object-dtype", c, npy_input(lambda x: _hdr(_shape(x), descr="|O")))
    add("npy-fortran-order", c, npy_input(lambda x: _hdr(_shape(x), fortran="True")))
    add("npy-rank-9", c, npy_input(lambda x: _hdr("(" + "1, " * (9 - x.ndim) + _shape(x)[1:])))
    add("npy-empty-file", c, npy_raw(lambda x: b""))
    add("npy-not-npy", c, npy_raw(lambda x: b"this is not a .npy file\n"))
    add("npy-version-2-header", c, npy_input(lambda x: _hdr(_shape(x)), version=2))
    add("npy-trailing-bytes", c, npy_input(lambda x: _hdr(_shape(x)), lambda x: x.tobytes() + b"\0" * 100))

    # (10) --threads
    c = "threads"
    add("threads-negative", c, threads("-1"))
    add("threads-one-million", c, threads("1000000"), native=True)
    add("threads-int-max", c, threads("2147483647"), native=True)
    add("threads-beyond-int", c, threads("99999999999"))
    add("threads-not-a-number", c, threads("many"))
    add("threads-one", c, threads("1"))

    # (11) manifest.json
    c = "manifest"

    def files_entry(**changes):
        def f(m, c_):
            for k, v in changes.items():
                m["files"][c_.rel["plan"]][k] = v
        return on_manifest(f)

    add("files-bytes-string", c, files_entry(bytes="1234"))
    add("files-bytes-negative", c, files_entry(bytes=-1))
    add("files-bytes-1e300", c, files_entry(bytes=1e300))
    add("files-sha256-null", c, files_entry(sha256=None))
    add("files-missing", c, on_manifest(lambda m, c_: m.pop("files")))
    add("files-array-for-object", c, on_manifest(lambda m, c_: m.update(files=list(m["files"].values()))))
    add("files-plan-unlisted", c, on_manifest(lambda m, c_: m["files"].pop(c_.rel["plan"])))
    add("targets-missing", c, on_manifest(lambda m, c_: m.pop("targets")))
    add("targets-empty", c, on_manifest(lambda m, c_: m.update(targets=[])))
    add("targets-object-for-array", c, on_manifest(lambda m, c_: m.update(targets={"t": c_.target(m)})))
    add("target-kind-unknown-device", c, on_target(kind="tpu"))
    add("target-kind-cuda-without-sm", c, on_target(kind="cuda"))
    add("target-arch-unknown", c, on_target(arch="riscv64"))
    add("target-cpu-features-string", c, on_target(cpu_features="avx2"))
    add("target-plan-number", c, on_target(plan=123))
    add("target-plan-is-the-weights", c, on_manifest(lambda m, c_: c_.target(m).update(plan=c_.rel["weights"])))
    add("manifest-version-string", c, on_manifest(lambda m, c_: m.update(version="1")))
    add("format-wrong", c, on_manifest(lambda m, c_: m.update(format="packager-plan")))
    add("name-missing", c, on_manifest(lambda m, c_: m.pop("name")))
    add("manifest-json-array", c, write_text("manifest", "[]"), sign=False)
    add("manifest-trailing-garbage", c,
        lambda c_: (c_.pkg / "manifest.json").write_text((c_.pkg / "manifest.json").read_text() + "\n}{"), sign=False)
    add("tampered-weights-unsigned", c, flip_byte("weights"), sign=False)
    add("tampered-plan-unsigned", c, set_tensor(_in, offset=lambda t, pr: t["offset"] + 64), sign=False)
    assert len({v.name for v in out}) == len(out), "variant names must be unique (they name folders)"
    return out


# --------------------------------------------------------------------------------------------
# Re-signing
# --------------------------------------------------------------------------------------------

def _stat_key(p: Path):
    try:
        st = os.lstat(p)
    except OSError:
        return None
    return st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino


def _entry_path(pkg: Path, rel: str) -> Path:
    return Path(rel) if os.path.isabs(rel) else pkg / rel


def snapshot(pkg: Path) -> dict:
    """lstat of every file the manifest lists (to see later which ones a mutation changed)."""
    m = json.loads((pkg / "manifest.json").read_text())
    return {rel: _stat_key(_entry_path(pkg, rel)) for rel in m["files"]}


def signature(p: Path) -> tuple[str, int] | None:
    """(sha256, bytes) of what the runtime would read at `p` (through symlinks); FIFOs and other
    special files are never opened (they would block): empty content, their stat size."""
    try:
        st = os.stat(p)
    except OSError:
        return None
    if stat.S_ISREG(st.st_mode):
        data = p.read_bytes()
        return hashlib.sha256(data).hexdigest(), len(data)
    return hashlib.sha256(b"").hexdigest(), st.st_size


def resign(pkg: Path, before: dict) -> None:
    """Recomputes sha256 and bytes of every manifest entry whose file changed since `before` (or
    that is new), so the package passes its checksum check. A manifest that is no longer a JSON
    object with a `files` object is left alone."""
    mpath = pkg / "manifest.json"
    try:
        m = json.loads(mpath.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(m, dict) or not isinstance(m.get("files"), dict):
        return
    changed = False
    for rel, entry in m["files"].items():
        if not isinstance(entry, dict):
            continue
        p = _entry_path(pkg, rel)
        if rel in before and _stat_key(p) == before[rel]:
            continue
        sig = signature(p)
        if sig is None:
            continue
        entry["sha256"], entry["bytes"] = sig
        changed = True
    if changed:
        mpath.write_text(json.dumps(m, indent=1))


# --------------------------------------------------------------------------------------------
# Running and classifying
# --------------------------------------------------------------------------------------------

OUTCOMES = ("clean", "correct", "wrong", "crash", "hang", "sanitizer", "messy")
SANITIZER_MARKERS = ("AddressSanitizer", "UndefinedBehaviorSanitizer", "runtime error:")
# With allocator_may_return_null=1 ASan still prints this when an allocation fails (and returns
# NULL, as glibc would): the allocation failing is no report; what the runtime then says is judged.
ALLOCATION_WARNING = re.compile(r"^==\d+==WARNING: AddressSanitizer failed to allocate 0x[0-9a-f]+ bytes\n?", re.MULTILINE)
NATIVE_ADDRESS_SPACE = 2 << 30   # RLIMIT_AS for `native` variants: thread stacks run out, not the machine's pids


@dataclass
class Row:
    name: str
    cls: str
    outcome: str
    exit: str          # the exit code, a signal name, or "timeout"
    message: str       # stderr's first line (for sanitizer reports, the report's line)
    seconds: float
    stderr: str = field(default="", repr=False)


def classify(returncode: int | None, stderr: str, outputs_equal: Callable[[], bool]) -> str:
    if returncode is None:
        return "hang"
    if any(m in stderr for m in SANITIZER_MARKERS):
        return "sanitizer"
    if returncode < 0:
        return "crash"
    if returncode == 0:
        return "correct" if outputs_equal() else "wrong"
    lines = stderr.strip().splitlines()
    if returncode in (1, 2) and len(lines) == 1 and lines[0].startswith("packrt-run: error:"):
        return "clean"
    return "messy"


def first_line(stderr: str, outcome: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if outcome == "sanitizer":
        for ln in lines:
            if "ERROR: AddressSanitizer" in ln or "runtime error:" in ln or "UndefinedBehaviorSanitizer:" in ln:
                return ln
    return lines[0] if lines else ""


def load_outputs(out_dir: Path) -> dict[str, np.ndarray]:
    """Every NAME.npy in out_dir (memory-mapped first: a header with a huge shape fails, it does
    not allocate)."""
    return {p.name: np.array(np.load(p, mmap_mode="r", allow_pickle=False)) for p in sorted(out_dir.glob("*.npy"))}


def outputs_equal(out_dir: Path, reference: dict[str, np.ndarray]) -> bool:
    for name, want in reference.items():
        try:
            got = np.array(np.load(out_dir / name, mmap_mode="r", allow_pickle=False))
        except (OSError, ValueError, EOFError):
            return False
        if got.dtype != want.dtype or got.shape != want.shape or \
                not np.allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True):
            return False
    return True


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_STACK, (8 << 20, 8 << 20))
    resource.setrlimit(resource.RLIMIT_AS, (NATIVE_ADDRESS_SPACE, NATIVE_ADDRESS_SPACE))


def execute(exe: Path, case: Case, out_dir: Path, timeout: float, native: bool = False):
    """Runs packrt-run on the case; (returncode or None on timeout, stderr, seconds)."""
    cmd = [str(exe), str(case.package_arg or case.pkg)]
    for name, path in case.inputs.items():
        cmd += ["--input", f"{name}={path}"]
    cmd += ["--output-dir", str(out_dir), "--iters", "1", "--warmup", "0", f"--threads={case.threads}"]
    env = {**os.environ, **SANITIZER_ENV}
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True,
                         preexec_fn=_limits if native else None)
    try:
        _, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
        rc = None
    return rc, err.decode("utf-8", "replace"), time.monotonic() - t0


def _exit_text(rc: int | None, timeout: float) -> str:
    if rc is None:
        return f"timeout {timeout:g} s"
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return str(rc)


def copy_package(base: Path, dst: Path) -> None:
    """The package without runtime/ and ort/ (packrt-run reads neither; the binary is run from
    the base package or the sanitized build)."""
    shutil.copytree(base, dst, symlinks=True,
                    ignore=lambda d, names: [n for n in names if Path(d) == base and n in ("runtime", "ort")])


def default_inputs(package: Path, work: Path) -> dict[str, Path]:
    """Random inputs (seed 7, like tests/conftest.py's cnn_input) for the first profile."""
    m = json.loads((package / "manifest.json").read_text())
    plan = json.loads((package / host_target(m)["plan"]).read_text())
    pr = plan["profiles"][0]
    rng = np.random.default_rng(7)
    out = {}
    for io in pr["inputs"]:
        t = pr["tensors"][io["tensor"]]
        p = work / f"{io['name']}.npy"
        np.save(p, rng.standard_normal(t["shape"]).astype(t["dtype"]))
        out[io["name"]] = p
    return out


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def run_variants(package: Path, inputs: dict[str, Path] | None = None, table: Path | None = None,
                 runtime: Path | None = None, work: Path | None = None, timeout: float = 20.0,
                 only: list[str] | None = None, keep: bool = False, log=None) -> list[Row]:
    """Runs packrt-run (`runtime`, default the package's own) on every variant of `package` and
    classifies each result against the undamaged package's outputs. Writes the Markdown table
    to `table` if given. A variant's folder is kept under `work` when its outcome is neither
    clean nor correct (or always with keep=True)."""
    base = Path(package).resolve()
    own = base / "runtime" / os.uname().machine / "bin" / "packrt-run"
    exe = Path(runtime) if runtime else own
    work = Path(work) if work else Path(tempfile.mkdtemp(prefix="malformed-"))
    work.mkdir(parents=True, exist_ok=True)
    work = work.resolve()
    inputs = dict(inputs) if inputs else default_inputs(base, work)
    rel = {k: host_target(json.loads((base / "manifest.json").read_text()))[k] for k in ("plan", "kernels", "weights")}

    def prepare(name: str) -> tuple[Case, Path]:
        d = work / _safe(name)
        shutil.rmtree(d, ignore_errors=True)
        (d / "scratch").mkdir(parents=True)
        copy_package(base, d / "pkg")
        return Case(d / "pkg", d / "scratch", dict(inputs), rel), d

    case, d = prepare("_reference")
    rc, err, _ = execute(exe, case, d / "out", timeout)
    if rc != 0:
        raise RuntimeError(f"the undamaged package does not run ({_exit_text(rc, timeout)}): {err.strip()[-2000:]}")
    reference = load_outputs(d / "out")
    if not reference:
        raise RuntimeError("the undamaged package wrote no outputs")

    rows = []
    for v in variants():
        if only and not any(o in v.name for o in only):
            continue
        case, d = prepare(v.name)
        before = snapshot(case.pkg)
        try:
            v.mutate(case)
        except Exception as e:
            raise RuntimeError(f"variant {v.name}: the mutation itself failed: {e!r}") from e
        if v.sign:
            resign(case.pkg, before)
        rc, err, secs = execute(own if v.native else exe, case, d / "out", timeout, native=v.native)
        judged = ALLOCATION_WARNING.sub("", err)
        outcome = classify(rc, judged, lambda out=d / "out": outputs_equal(out, reference))
        message = first_line(judged, outcome).replace(f"{work}/", "")   # variant folders: relative
        rows.append(Row(v.name, v.cls, outcome, _exit_text(rc, timeout), message, secs, err))
        if log:
            log(f"{v.name:45s} {outcome:9s} {rows[-1].exit:8s} {rows[-1].message[:100]}")
        if not keep and outcome in ("clean", "correct"):
            shutil.rmtree(d, ignore_errors=True)
    if table:
        write_table(rows, Path(table), title=f"packrt-run `{exe}` on variants of `{base}` (in `{work}`)")
    return rows


def _cell(text: str, limit: int = 180) -> str:
    text = text.replace("|", "\\|").replace("`", "'")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_table(rows: list[Row], path: Path, title: str = "") -> None:
    counts = {o: sum(r.outcome == o for r in rows) for o in OUTCOMES}
    lines = [f"# Malformed packages{': ' + title if title else ''}", "",
             f"{len(rows)} variants: " + ", ".join(f"{n} {o}" for o, n in counts.items() if n) +
             f"; {sum(r.seconds for r in rows):.0f} s", "",
             "| variant | class | outcome | exit | first line of stderr |", "|---|---|---|---|---|"]
    lines += [f"| {r.name} | {r.cls} | {r.outcome} | {r.exit} | {_cell(r.message)} |" for r in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run packrt-run on malformed variants of a built package.")
    ap.add_argument("package", type=Path, nargs="?", help="a built package folder (e.g. the cnn sample's)")
    ap.add_argument("--table", type=Path, help="write the Markdown table here")
    ap.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                    help="inputs (default: random, seed 7, of the first profile's shapes)")
    rt = ap.add_mutually_exclusive_group()
    rt.add_argument("--sanitized", action="store_true", help="build (once, cached) and use the ASan+UBSan packrt-run")
    rt.add_argument("--runtime", type=Path, help="this packrt-run instead of the package's own")
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--only", action="append", help="only variants whose name contains this (repeatable)")
    ap.add_argument("--work", type=Path, help="folder for the variants (default: a new temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep every variant's folder")
    ap.add_argument("--list", action="store_true", help="list the variants and exit")
    ap.add_argument("--build-only", action="store_true", help="build the sanitized runtime, print its path, exit")
    a = ap.parse_args(argv)
    if a.list:
        for v in variants():
            print(f"{v.cls:12s} {v.name}")
        return 0
    if a.build_only:
        print(build_sanitized_runtime(log=lambda m: print(m, file=sys.stderr)))
        return 0
    if a.package is None:
        ap.error("a package folder is needed")
    runtime = build_sanitized_runtime(log=lambda m: print(m, file=sys.stderr)) if a.sanitized else a.runtime
    inputs = dict(s.split("=", 1) for s in a.input) if a.input else None
    inputs = {k: Path(v).resolve() for k, v in inputs.items()} if inputs else None
    t0 = time.monotonic()
    rows = run_variants(a.package, inputs, a.table, runtime, a.work, a.timeout, a.only, a.keep, log=print)
    bad = [r for r in rows if r.outcome not in ("clean", "correct")]
    print(f"{len(rows)} variants in {time.monotonic() - t0:.0f} s; {len(bad)} neither clean nor correct"
          + (f"; table: {a.table}" if a.table else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
