"""Timing chains of kernels as a package runs them once per inference: optimize/winograd times
a conv's three Winograd kernels against the direct conv this way.

Each kernel of a chain reads the previous kernel's output as its first argument, and the chain
runs back to back. Before every run the chain's input is rewritten on all cores (as the kernel
before it in the model leaves it) and every kernel's other inputs (its weights) are flushed from
the caches (as the rest of the model leaves them); what one kernel writes and the next reads
stays wherever the first left it. Timing the kernels one by one cannot say that: warm, a GEMM on
Winograd's transformed weight (2.25x a conv's) ran 1.5-4.5x faster than in the model; with every
argument but its activation flushed, its 2.25x larger intermediates came from DRAM, and half the
gains measured in the models were not chosen (docs/winograd.md).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import tirx

from ....targets import Target
from .compile import build_library
from .timing import COLD_FLUSH, COLD_RUNS, MIN_SECONDS, Tally, _args, _copy_kernel, time_interleaved

MAX_RUNS = 100                 # runs per repeat at most (each also pays an untimed flush and rewrite)


@dataclass
class _Chain:
    """One chain's compiled kernels and their arguments, wired output to input."""

    kernels: list                  # packed functions, in order
    args: list[list]               # each kernel's tensors; kernel i's first is kernel i-1's last
    stash: object                  # the chain's input, rewritten into args[0][0] before each run
    copy: object                   # the kernel that rewrites it on all cores
    weights: list                  # every kernel's inputs but the first: flushed before each run

    def run(self, flush) -> float:
        """Seconds of one run of the chain, its input just written and its weights flushed."""
        if self.weights:
            flush(self.stash, *self.weights)          # TVM's flush skips its first argument
        self.copy(self.stash, self.args[0][0])
        t0 = time.perf_counter()
        for kernel, args in zip(self.kernels, self.args):
            kernel(*args)
        return time.perf_counter() - t0


def _wire(chain: list[tirx.PrimFunc], rng: np.random.Generator, dev) -> list[list]:
    """Random arguments for each kernel, each kernel's first being the previous one's output."""
    wired: list[list] = []
    for k, func in enumerate(chain):
        out = wired[-1][-1] if wired else None
        if out is not None:
            p = func.params[0]
            shape, dtype = tuple(int(d) for d in p.shape), str(p.dtype)
            if tuple(out.shape) != shape or str(out.dtype) != dtype:
                raise ValueError(f"kernel {k} of a chain: its first argument {shape} {dtype} is not the "
                                 f"previous kernel's output {tuple(out.shape)} {out.dtype}")
        wired.append(_args(func, rng, dev, first=out))   # an intermediate (Winograd's V: 170 MB) is not made twice
    return wired


def _runs_per_repeat(chain: _Chain, flush) -> int:
    """Runs per repeat so that one lasts MIN_SECONDS of timed runs, at least COLD_RUNS."""
    once = min(chain.run(flush) for _ in range(2))    # the first run also pays the lazy loads
    return max(COLD_RUNS, min(MAX_RUNS, math.ceil(MIN_SECONDS / max(once, 1e-6))))


def time_chains(chains: list[list[tirx.PrimFunc]], target: Target, rounds: int = 3,
                tally: Tally | None = None) -> list[float | None]:
    """Seconds per run of each chain of (already scheduled) kernels, as the module docstring
    says; the chains timed in alternation for `rounds` rounds, the fastest run kept per chain
    (one round once the build's timing budget is spent). None: a kernel failed to run. An RPC
    target's kernels are timed one by one there, warm, and summed per chain."""
    if target.rpc is not None:
        flat = time_interleaved([f for c in chains for f in c], target, rounds, tally=tally)
        ends = np.cumsum([0] + [len(c) for c in chains])
        return [None if None in flat[a:b] else sum(flat[a:b]) for a, b in zip(ends[:-1], ends[1:])]
    tally = tally if tally is not None else Tally()
    t0 = tally.start()
    named = {f"c{i}_{k}": f for i, c in enumerate(chains) for k, f in enumerate(c)}
    named.update({f"written_first{i}": _copy_kernel(c[0].params[0], target) for i, c in enumerate(chains)})
    lib, dev = build_library(named, tvm.target.Target(target.llvm_target())), tvm.cpu()
    flush = tvm.get_global_func(COLD_FLUSH)
    rng = np.random.default_rng(0)
    runs: list[_Chain | None] = []
    number: list[int] = []
    for i, chain in enumerate(chains):
        args = _wire(chain, rng, dev)
        stash = tvm.runtime.tensor(args[0][0].numpy(), device=dev)
        made = _Chain([lib[f"c{i}_{k}"] for k in range(len(chain))], args, stash, lib[f"written_first{i}"],
                      [a for kernel_args in args for a in kernel_args[1:-1]])
        try:
            number.append(_runs_per_repeat(made, flush))
        except Exception:  # noqa: BLE001 - a chain that fails to run is reported as untimed
            made = None
            number.append(0)
        runs.append(made)
    if tally.over_budget():
        rounds = 1
        tally.cut += 1
    best = [math.inf if c is not None else None for c in runs]
    for _ in range(rounds):
        for i, chain in enumerate(runs):
            if chain is not None:
                best[i] = min(best[i], *(chain.run(flush) for _ in range(number[i])))
    tally.add(sum(len(c) for c in chains), t0)
    return best
