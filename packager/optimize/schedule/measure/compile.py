"""Compiling the candidates a build runs here, on every core.

A cold build spends most of its timing in LLVM, not in running kernels: ResNet-50's 118 timing
calls compiled for 67 s and ran for 17 s (2-vCPU AMD EPYC). TVM releases the GIL in its compiler,
so the candidates are split into one module per core, each built and JIT-compiled on its own
thread (the first function lookup compiles an LLVM module: that runs on the worker too). Nothing
is timed while this runs: timing starts once every module is compiled. An RPC target's
candidates stay one module (one upload).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import tvm
from tvm import tirx

MIN_PER_MODULE = 2            # fewer candidates than this per core: one module (a thread costs more)


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


def build_library(funcs: dict[str, tirx.PrimFunc], target: tvm.target.Target, parallel: bool = True) -> Library:
    """All `funcs` compiled under their names; split over this machine's cores when `parallel`
    and there are enough of them (a compile error in any part raises, as one module's would)."""
    named = [(n, f.with_attr("global_symbol", n)) for n, f in funcs.items()]
    parts = max(1, min(cores(), len(named) // MIN_PER_MODULE)) if parallel else 1
    groups = [named[i::parts] for i in range(parts)]
    if parts == 1:                         # compiled by the JIT where it is first used (or exported for RPC)
        return Library([_compile(groups[0], target, jit=False)], [[n for n, _ in groups[0]]])
    with ThreadPoolExecutor(parts) as pool:
        modules = list(pool.map(lambda g: _compile(g, target, jit=True), groups))
    return Library(modules, [[n for n, _ in g] for g in groups])


def _compile(group: list[tuple[str, tirx.PrimFunc]], target: tvm.target.Target, jit: bool):
    lib = tvm.tirx.build(tvm.IRModule(dict(group)), target=target)
    if jit:
        lib[group[0][0]]                   # the JIT compiles the whole module at its first lookup
    return lib
