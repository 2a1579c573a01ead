"""A CUDA target's plan run on the CPU: its kernels as OpenCL C (codegen/opencl.py, written at
build time) on PoCL through pyopencl, launched with the grids and blocks the build recorded.

What this checks is the schedule: tile bounds, thread and block indexing, shared-memory staging
and barriers, phase order. Every tensor gets its own buffer and every arena tensor and scratch
buffer starts as NaN, so a kernel that reads what nothing wrote shows up as NaN in the outputs.
What it cannot see: the fatbin and the driver API (module loading, cooperative launches, CUDA
graphs), warp shuffles, timing; the GPU suite (`pack gpu-suite`) is the real check.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import UserError

SETUP = ("apt-get install pocl-opencl-icd (PoCL, OpenCL on the CPU) and pip install pyopencl "
         "(both are in the README's set-up line)")
POISON = 0xFF                      # every byte 0xFF: NaN as float, -1 as an integer


@dataclass
class Emulation:
    """What the OpenCL form of a target's kernels covers."""

    kernels: int
    not_emulated: dict[str, str] = field(default_factory=dict)     # kernel -> why
    differences: dict[str, list[str]] = field(default_factory=dict)  # kernel -> what OpenCL runs differently

    @property
    def emulated(self) -> int:
        return self.kernels - len(self.not_emulated)

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for notes in self.differences.values():
            for note in notes:
                kinds[note.split(":")[0]] = kinds.get(note.split(":")[0], 0) + 1
        text = f"{self.emulated} of {self.kernels} kernels emulated on PoCL"
        if kinds:
            text += " (run differently: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + ")"
        return text


def read_emulation(folder: Path, target: dict) -> tuple[dict, str, Emulation]:
    """emulation.json, the OpenCL source and their summary for a manifest target in `folder`."""
    rel = target.get("emulation")
    doc_path = folder / rel if rel else None
    if doc_path is None or not doc_path.is_file():
        raise UserError(f"{folder}: target '{target['name']}' has no OpenCL form of its kernels "
                        "(the package was built before emulation existed); rebuild it")
    doc = json.loads(doc_path.read_text())
    source = (doc_path.parent / "kernels.cl").read_text()
    info = Emulation(len(doc["kernels"]))
    for name, k in doc["kernels"].items():
        if not k["emulated"]:
            info.not_emulated[name] = k["reason"]
        elif k["differences"]:
            info.differences[name] = k["differences"]
    return doc, source, info


def emulate(folder: Path, target: dict, profile: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run one profile of a CUDA target's plan on PoCL; its outputs by name. Raises UserError
    when a kernel the profile calls has no OpenCL form (the reason is in emulation.json)."""
    doc, source, info = read_emulation(folder, target)
    plan = json.loads((folder / target["plan"]).read_text())
    prof = next((p for p in plan["profiles"] if p["name"] == profile), None)
    if prof is None:
        raise UserError(f"{folder}: target '{target['name']}' has no profile '{profile}'")
    needed = {plan["kernels"][s["kernel"]]["name"] for s in prof["steps"] if s["op"] == "kernel"}
    missing = sorted(needed & set(info.not_emulated))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UserError(f"cannot emulate target '{target['name']}': kernel '{missing[0]}' has no OpenCL form "
                        f"({info.not_emulated[missing[0]]}){more}")
    cl, ctx, queue = _opencl()
    aliases = _aliases(doc)
    program = _program(ctx, _renamed(source, aliases))
    weights = folder / target["weights"]
    bufs = _tensors(cl, ctx, queue, prof, weights.read_bytes() if weights.is_file() else b"", feeds)
    for step in prof["steps"]:
        if step["op"] == "copy":
            src, dst = step["args"]
            cl.enqueue_copy(queue, bufs[dst], bufs[src], byte_count=prof["tensors"][src]["bytes"])
            continue
        if step["op"] == "assemble":              # one buffer per tensor here: the parts are copied in
            *parts, whole = step["args"]
            at = 0
            for p in parts:
                n = prof["tensors"][p]["bytes"]
                cl.enqueue_copy(queue, bufs[whole], bufs[p], byte_count=n, dst_offset=at)
                at += n
            continue
        entry = doc["kernels"][plan["kernels"][step["kernel"]]["name"]]
        scratch = [_poisoned(cl, ctx, queue, n) for n in entry["workspace"]]
        for launch in entry["launches"]:
            args = [bufs[step["args"][a]] if a >= 0 else scratch[-a - 1] for a in launch["args"]]
            kernel = cl.Kernel(program, aliases[launch["function"]])
            if launch["shared_bytes"] and kernel.num_args > len(args):
                args.append(cl.LocalMemory(launch["shared_bytes"]))
            kernel.set_args(*args)
            local = tuple(launch["block"])
            cl.enqueue_nd_range_kernel(queue, kernel, tuple(g * b for g, b in zip(launch["grid"], local)), local)
    queue.finish()
    outputs = {}
    for out in prof["outputs"]:
        t = prof["tensors"][out["tensor"]]
        host = np.empty(t["shape"], dtype=np.dtype(t["dtype"]))
        if host.nbytes:
            cl.enqueue_copy(queue, host, bufs[out["tensor"]])
        outputs[out["name"]] = host
    queue.finish()
    return outputs


def _tensors(cl, ctx, queue, prof: dict, weights: bytes, feeds: dict[str, np.ndarray]) -> list:
    """One OpenCL buffer per plan tensor: weights from weights.bin, inputs from `feeds`, the rest poisoned."""
    inputs = {io["tensor"]: io["name"] for io in prof["inputs"]}
    bufs = []
    for i, t in enumerate(prof["tensors"]):
        if t["storage"] == "weights":
            data = np.frombuffer(weights, dtype=np.uint8, count=t["bytes"], offset=t["offset"])
            bufs.append(cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=data.copy())
                        if t["bytes"] else cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4))
        elif i in inputs:
            data = np.ascontiguousarray(feeds[inputs[i]], dtype=np.dtype(t["dtype"]))
            bufs.append(cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)
                        if data.nbytes else cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4))
        else:
            bufs.append(_poisoned(cl, ctx, queue, t["bytes"]))
    return bufs


def _poisoned(cl, ctx, queue, nbytes: int):
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, max(nbytes, 4))
    cl.enqueue_fill_buffer(queue, buf, np.uint8(POISON), 0, max(nbytes, 4))
    return buf


def _aliases(doc: dict) -> dict[str, str]:
    """A short name per kernel function: PoCL builds cache file names from kernel names and
    aborts on long ones (fused kernels' names run past a hundred characters)."""
    functions = sorted({ln["function"] for k in doc["kernels"].values() if k["emulated"] for ln in k["launches"]})
    return {f: f"k{i}" for i, f in enumerate(functions)}


def _renamed(source: str, aliases: dict[str, str]) -> str:
    if not aliases:
        return source
    names = re.compile(r"\b(" + "|".join(re.escape(f) for f in sorted(aliases, key=len, reverse=True)) + r")\b")
    return names.sub(lambda m: aliases[m.group(1)], source)


@lru_cache(maxsize=1)
def _opencl():
    """pyopencl, a context on PoCL's CPU device and a queue (an in-order queue: launches run in turn)."""
    try:
        import pyopencl as cl
    except ImportError:
        raise UserError(f"GPU emulation needs pyopencl and PoCL: {SETUP}") from None
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    devices = [d for p in platforms if "Portable Computing Language" in p.name
               for d in p.get_devices(device_type=cl.device_type.CPU)]
    if not devices:
        raise UserError(f"GPU emulation needs PoCL's CPU device, and OpenCL lists none: {SETUP}")
    ctx = cl.Context(devices=devices[:1])
    return cl, ctx, cl.CommandQueue(ctx)


_PROGRAMS: dict[int, object] = {}


def _program(ctx, source: str):
    """The OpenCL program of a source, compiled once per process (PoCL also caches on disk)."""
    key = hash(source)
    if key not in _PROGRAMS:
        import pyopencl as cl

        if "cl_khr_fp16" in source and "cl_khr_fp16" not in ctx.devices[0].extensions:
            raise UserError("the kernels compute in fp16 and this PoCL device has no half-precision arithmetic "
                            "(cl_khr_fp16); an fp16 package is checked on a GPU (`pack gpu-suite --precision fp16`)")
        try:
            _PROGRAMS[key] = cl.Program(ctx, source).build()
        except cl.RuntimeError as e:
            raise UserError(f"PoCL could not compile the emulated kernels: {str(e).strip().splitlines()[-1]}") from None
    return _PROGRAMS[key]

