"""Cooperative kernels: the device kernels of a phased PrimFunc (optimize/schedule/phases.py)
joined into one kernel with a grid barrier between phases, launched cooperatively.

TVM lowers a phased PrimFunc to one device kernel per phase. Each becomes a device function
whose block index is a parameter, and a `<kernel>_grid` wrapper runs the phases in order: every
block walks the phase's blocks with a grid-stride loop (so any co-resident grid computes every
block), then `cooperative_groups::this_grid().sync()` makes the phase's writes visible to all
blocks before the next phase reads them. Pointers lose `__restrict__` in the joined kernel: a
tensor written in one phase and read in the next is not read-only for the kernel's lifetime,
which the non-coherent load path `__restrict__` allows would assume.

A grid barrier deadlocks unless every block of the grid is resident at once. The grid is
sized from the compiled kernel's registers and shared memory (cuobjdump) and the target's
hardware table: blocks per SM (the occupancy rules of the CUDA programming guide) x SMs, capped
at the largest phase; a kernel of which not one block fits an SM is refused (its phases stay
separate launches). The runtime asks the driver's occupancy API on the GPU it runs on, lowers the
grid to what is resident there (the grid-stride loops make any grid compute the same), and
refuses the plan when not one block fits (runtime_cpp/src/cuda/cuda_executor.cpp).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InternalError
from ..targets.table import STATIC_SHARED_BYTES
from .cuda_source import CudaModule, Launch
from .cuda_toolchain import resource_usage

GRID_SUFFIX = "_grid"
# TVM writes __launch_bounds__ only for kernels with more than one thread per block
_DEFINITION = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\((\d+)\) )?(\w+)\(([^)]*)\)\s*\{')
_STATIC_SHARED = re.compile(r"__shared__\s+(?:alignas\(\d+\)\s+)?([\w:]+)\s+\w+\[(\d+)\]")
_BYTES = {"float": 4, "half": 2, "__half": 2, "nv_bfloat16": 2, "__nv_bfloat16": 2, "int": 4, "uint": 4,
          "signed char": 1, "char": 1, "uchar": 1, "int8_t": 1, "uint8_t": 1, "short": 2, "int16_t": 2}
WARP = 32
REGISTER_UNIT = 256                # registers are allocated per warp in units of 256
SM_PARTITIONS = 4                  # a warp's registers come from one of the SM's 4 sub-partitions


@dataclass
class Joined:
    """A phased kernel's cooperative wrapper before its grid is known."""

    function: str
    args: list[int]                # the wrapper's pointer parameters, as launch argument refs
    block: list[int]
    shared_bytes: int              # dynamic shared memory: the largest phase's
    blocks: list[int]              # blocks of each phase


@dataclass
class GridReport:
    joined: dict[str, dict] = field(default_factory=dict)      # kernel -> grid, phases, occupancy
    refused: dict[str, str] = field(default_factory=dict)      # kernel -> why its phases stay launches

    def as_dict(self) -> dict:
        return {"cooperative_kernels": len(self.joined), "kernels": self.joined, "refused": self.refused}

    def note(self) -> str:
        if not self.joined and not self.refused:
            return ""
        phases = sum(j["phases"] for j in self.joined.values())
        text = f", {len(self.joined)} cooperative kernel(s) for {phases} phases"
        return text + (f" ({len(self.refused)} phased kernel(s) left as launches)" if self.refused else "")


def join_phases(cm: CudaModule, phased: set[str]) -> tuple[str, dict[str, Joined], dict[str, str]]:
    """The source with each phased kernel whose phases share one block shape joined: its phases'
    kernels become device functions and a cooperative wrapper calls them; the wrappers; and why
    the other phased kernels keep one launch per phase."""
    definitions = kernel_definitions(cm.source)
    source, extra, joined, refused = cm.source, [], {}, {}
    for name in sorted(phased):
        launches = cm.kernels[name].launches
        if len(launches) < 2:
            refused[name] = "lowered to a single launch"
            continue
        if any(ln.block != launches[0].block for ln in launches):
            refused[name] = "phases lowered to different block shapes: " + ", ".join(
                "x".join(map(str, ln.block)) for ln in launches)
            continue
        missing = [ln.function for ln in launches if ln.function not in definitions]
        if missing:
            raise InternalError(f"no definition of '{missing[0]}' in the CUDA source")
        shared = sum(_static_shared(definitions[ln.function][1]) for ln in launches)
        if shared > STATIC_SHARED_BYTES:     # a joined kernel holds every phase's static arrays
            refused[name] = f"the phases' static shared memory together ({shared} B) exceeds a kernel's 48 KB"
            continue
        for ln in launches:
            source = _without_kernel(source, ln.function)
        text, joined[name] = _wrapper(name, launches, definitions)
        extra.append(text)
    if not extra:
        return cm.source, joined, refused
    return "#include <cooperative_groups.h>\n" + source + "\n" + "\n".join(extra), joined, refused


def cooperative_launches(joined: dict[str, Joined], fatbin: Path, facts: dict, sm: int,
                         report: GridReport) -> dict[str, Launch]:
    """Each joined kernel's cooperative launch with a co-resident grid (or, in the report, why not)."""
    launches: dict[str, Launch] = {}
    if not joined:
        return launches

    usage = resource_usage(fatbin)
    for name, j in joined.items():
        if j.function not in usage:
            raise InternalError(f"cuobjdump lists no '{j.function}' in the compiled kernels")
        regs, static_shared = usage[j.function]
        threads = math.prod(j.block)
        per_sm = blocks_per_sm(facts, sm, threads, regs, static_shared + j.shared_bytes)
        capacity = per_sm * facts["sms"]
        if capacity < 1:
            report.refused[name] = (f"not co-resident: a block of {threads} threads, {regs} registers each and "
                                    f"{static_shared + j.shared_bytes} B shared memory does not fit an SM")
            continue
        grid = min(max(j.blocks), capacity)
        launches[name] = Launch(j.function, j.args, [grid, 1, 1], j.block, j.shared_bytes, True)
        report.joined[name] = {"phases": len(j.blocks), "grid": grid, "phase_blocks": j.blocks,
                               "blocks_per_sm": per_sm, "co_resident": capacity, "registers": regs,
                               "shared_bytes": static_shared + j.shared_bytes}
    return launches


def blocks_per_sm(facts: dict, sm: int, threads: int, registers: int, shared_bytes: int) -> int:
    """Resident blocks per SM (the CUDA programming guide's occupancy rules): the fewest the
    thread, block, register and shared-memory limits allow."""
    warps = -(-threads // WARP)
    limits = [facts.get("max_threads_per_sm", 2048) // WARP // warps, facts.get("max_blocks_per_sm", 32)]
    if registers:
        per_warp = -(-registers * WARP // REGISTER_UNIT) * REGISTER_UNIT
        per_partition = facts["registers_per_sm"] // SM_PARTITIONS
        limits.append(SM_PARTITIONS * (per_partition // per_warp) // warps)
    reserved = 1024 if sm >= 80 else 0          # the runtime's shared memory per block from sm_80
    per_block = -(-(shared_bytes + reserved) // 128) * 128
    if per_block:
        limits.append(facts["smem_per_sm_kb"] * 1024 // per_block)
    return max(min(limits), 0)


def _static_shared(body: str) -> int:
    """Bytes of a kernel body's static __shared__ arrays (8 per element for a type not listed)."""
    return sum(_BYTES.get(dtype, 8) * int(n) for dtype, n in _STATIC_SHARED.findall(body))


def kernel_definitions(source: str) -> dict[str, tuple[str, str]]:
    """Each __global__ function's parameter list and body."""
    return {m.group(2): (m.group(3), source[m.end():_body_end(source, m.end(), m.group(2)) - 1])
            for m in _DEFINITION.finditer(source)}


def _body_end(source: str, start: int, function: str) -> int:
    """The index just past the brace closing a body that opens before `start`."""
    depth, i = 1, start
    while depth:
        if i >= len(source):
            raise InternalError(f"unbalanced braces in the CUDA source of '{function}'")
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        i += 1
    return i


def _without_kernel(source: str, function: str) -> str:
    """The source without a __global__ function's declaration and definition."""
    head = re.compile(r'extern "C" __global__ void __launch_bounds__\(\d+\) ' + re.escape(function) + r"\([^)]*\)\s*")
    while (m := head.search(source)) is not None:
        if source[m.end()] == ";":
            source = source[:m.start()] + source[m.end() + 1:]
            continue
        source = source[:m.start()] + source[_body_end(source, m.end() + 1, function):]
    return source


def _wrapper(name: str, launches: list[Launch], definitions: dict) -> tuple[str, Joined]:
    """The device function of every phase and the cooperative kernel that runs them in order."""
    refs: dict[int, str] = {}
    params: list[str] = []
    parts, steps = [], []
    for k, ln in enumerate(launches):
        plist, body = definitions[ln.function]
        decls = [_unrestricted(p) for p in plist.split(",")]
        for decl, ref in zip(decls, ln.args):
            if ref not in refs:
                refs[ref] = f"pk_arg{len(refs)}"
                params.append(f"{decl.rsplit(' ', 1)[0]} {refs[ref]}")
        body = re.sub(r"\bblockIdx\.([xyz])\b", r"pk_block.\1", body)
        parts.append(f"__device__ __forceinline__ void {ln.function}_phase(const uint3 pk_block, "
                     f"{', '.join(decls)}) {{{body}}}\n")
        gx, gy, gz = ln.grid
        if k:
            steps.append("  pk_grid.sync();")
        steps += [f"  for (unsigned pk_v = blockIdx.x; pk_v < {gx * gy * gz}u; pk_v += gridDim.x) {{",
                  f"    {ln.function}_phase(make_uint3(pk_v % {gx}u, (pk_v / {gx}u) % {gy}u, pk_v / {gx * gy}u), "
                  f"{', '.join(refs[r] for r in ln.args)});",
                  "    __syncthreads();            // the next block this one runs reuses its shared memory",
                  "  }"]
    function = name + GRID_SUFFIX
    threads = math.prod(launches[0].block)
    text = ("".join(parts) + f'extern "C" __global__ void __launch_bounds__({threads}) {function}({", ".join(params)}) {{\n'
            "  cooperative_groups::grid_group pk_grid = cooperative_groups::this_grid();\n" + "\n".join(steps) + "\n}\n")
    return text, Joined(function, list(refs), list(launches[0].block), max(ln.shared_bytes for ln in launches),
                        [math.prod(ln.grid) for ln in launches])


def _unrestricted(decl: str) -> str:
    return " ".join(decl.replace("__restrict__", "").split())
