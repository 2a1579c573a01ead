"""Compiling kernels on every core: the candidates a build times, and a package's kernels.

A cold build spends most of its timing in LLVM, not in running kernels: ResNet-50's 118 timing
calls compiled for 67 s and ran for 17 s (2-vCPU AMD EPYC). TVM releases the GIL in its compiler,
so the functions are split into one module per core, each built and finished on its own thread:
a candidate module is JIT-compiled there (the first function lookup compiles an LLVM module), a
package's part is written as an object file (codegen/cpu.py links the parts). Nothing is timed
while this runs: timing starts once every module is compiled. An RPC target's candidates stay
one module (one upload). `build_with_host` is the one-module build the CUDA backend and the
tensor-core rule read launches from.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import tvm
from tvm import tirx

MIN_PER_MODULE = 2            # fewer functions than this per core: one module (a thread costs more)
T = TypeVar("T")


class Library:
    """Compiled modules looked up by function name, as one module is."""

    def __init__(self, modules: list, names: list[list[str]]):
        self.modules = modules
        self._where = {n: m for m, ns in zip(modules, names) for n in ns}

    def __getitem__(self, name: str):
        return self._where[name][name]

    def time_evaluator(self, name: str, dev, **kwargs):
        return self._where[name].time_evaluator(name, dev, **kwargs)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                 # not Linux
        return os.cpu_count() or 1


def build_parts(funcs: dict[str, tirx.PrimFunc], target: tvm.target.Target,
                finish: Callable[[object, int, list[str]], T], parallel: bool = True) -> list[tuple[list[str], T]]:
    """`funcs` compiled under their names in one module per core (one when not `parallel` or too
    few), each module then passed with its index and names to `finish` on the thread that built
    it; the names and what `finish` returned, per module. A compile error in any part raises."""
    named = [(n, f.with_attr("global_symbol", n)) for n, f in funcs.items()]
    parts = max(1, min(cores(), len(named) // MIN_PER_MODULE)) if parallel else 1
    groups = [named[i::parts] for i in range(parts)]

    def one(i: int) -> T:
        lib = tvm.tirx.build(tvm.IRModule(dict(groups[i])), target=target)
        return finish(lib, i, [n for n, _ in groups[i]])

    if parts == 1:
        done = [one(0)]
    else:
        with ThreadPoolExecutor(parts) as pool:
            done = list(pool.map(one, range(parts)))
    return [([n for n, _ in g], d) for g, d in zip(groups, done)]


def build_library(funcs: dict[str, tirx.PrimFunc], target: tvm.target.Target, parallel: bool = True) -> Library:
    """All `funcs` compiled under their names, looked up as one module; split over this
    machine's cores when `parallel` and there are enough of them."""
    parts = build_parts(funcs, target, _jit if parallel else lambda lib, _i, _names: lib, parallel)
    return Library([lib for _, lib in parts], [names for names, _ in parts])


def _jit(lib, _index: int, names: list[str]):
    """The module compiled to machine code now, on this thread: the JIT compiles the whole
    module at its first function lookup (one module alone is left to its first use, or to an
    RPC export)."""
    lib[names[0]]
    return lib


def build_with_host(mod: tvm.IRModule, target: tvm.target.Target) -> tuple[tvm.runtime.Module, tvm.IRModule]:
    """tvm.tirx.build of `mod` for `target` (with an LLVM host), and the host module as it was
    before MakePackedAPI: where each kernel's launches (grid, block, dynamic shared memory) are
    still plain calls to read. Raises whatever TVM raises."""
    captured: dict = {}

    @tvm.instrument.pass_instrument
    class CaptureHost:
        def run_before_pass(self, m, info):
            if info.name == "tirx.MakePackedAPI":
                captured["mod"] = m

    with tvm.transform.PassContext(opt_level=3, instruments=[CaptureHost()]):
        lib = tvm.tirx.build(mod, target=target)
    return lib, captured["mod"]
