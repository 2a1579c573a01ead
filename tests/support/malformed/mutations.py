"""What a variant damages (a Case: the package copy, its scratch folder, packrt-run's inputs) and
the building blocks of damage: plan/manifest edits, file cuts, symlinks, FIFOs, .npy headers."""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


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


def _cuda_plan(launch_args: list[int], **launch) -> Callable[[dict], None]:
    def f(p):
        p["device"], p["module"] = "cuda", "kernels.fatbin"
        for k in p["kernels"]:
            k["workspace"] = []
            k["launches"] = [{"function": k["name"], "args": launch_args, "grid": [1, 1, 1], "block": [32, 1, 1],
                              **launch}]
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

