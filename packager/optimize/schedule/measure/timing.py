"""Timing candidate schedules of one kernel on this machine (CPU targets that run here) or on the
target's RPC device (`targets[i].rpc`, see rpc.py).

All candidates are compiled first (one module per core, compile.py) and timed in interleaved rounds on
the same random inputs with TVM's time evaluator: the minimum over repeats, so a noisy
neighbour costs a repeat, not the choice. The first candidate's output is the reference every
other candidate must match; a candidate that disagrees is dropped (and reported) rather than
trusted.

Candidates run as they run in the package (docs/scheduling.md has the measurements that chose
this): for a model whose weights exceed the last-level cache (`target.cold_weights`) each run is
timed after TVM's clflush of every argument but the first, so weights come from DRAM; and on this
machine the first argument (the activation) is rewritten on all cores before each run, as the
previous kernel leaves it. What timing costs is counted into the build's `Tally`.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import tirx

from ....targets import Target, can_run_here
from .agree import agree, rounds_through_half
from .compile import Library, build_library

MIN_SECONDS = 0.01            # each timing repeat runs the kernel at least this long
PRUNE = 1.25                  # a candidate this much slower than the fastest gets no more repeats
COLD_RUNS = 5                 # cold runs (each after a cache flush) per repeat of a cold-weights target
COLD_FLUSH = "cache_flush_cpu_non_first_arg"   # TVM runtime's clflush of every argument but the first
BUSY_CORES = 0.25             # other processes keeping this many cores busy while timing: the build says so
# Slow candidates (a conv over a long spectrogram runs 0.5-4 s) are timed with a bound, not the
# fast kernels' repeat counts: the correctness run every candidate makes anyway is its first
# timing; when the fastest of those took SLOW_SECONDS or more, a candidate SCREEN x slower than it
# is not timed again, and the others get one run per repeat (a run that long averages its own noise).
SLOW_SECONDS = 0.05
SCREEN = 2.0


def cpu_seconds() -> tuple[float, float] | None:
    """(seconds every CPU of this machine has spent busy or stolen by the hypervisor, seconds this
    process's threads have spent on a CPU), both since boot; None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks + [0] * (8 - len(ticks))
    own = os.times()
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"), own.user + own.system


@dataclass
class Tally:
    """Programs this process compiled and timed, the seconds that took, and the CPU time other
    processes took meanwhile (a build reports the difference over its run: what tuning cost, and
    whether the machine was busy while it timed)."""

    programs: int = 0
    seconds: float = 0.0
    screened: int = 0              # slow candidates not timed past their first run (clearly slower)
    budget_s: float = 0.0          # timing seconds after which candidates get one repeat each (0: no cap)
    cut: int = 0                   # choices made on one repeat per candidate (the budget spent)
    others_cpu_s: float = 0.0      # CPU seconds not this process's, while timing
    watched_s: float = 0.0         # seconds over which others_cpu_s was watched

    def start(self) -> tuple[float, tuple[float, float] | None]:
        return time.perf_counter(), cpu_seconds()

    def add(self, programs: int, since: tuple[float, tuple[float, float] | None]) -> None:
        t0, cpu0 = since
        wall = time.perf_counter() - t0
        self.programs += programs
        self.seconds += wall
        cpu1 = cpu_seconds()
        if cpu0 is not None and cpu1 is not None:
            self.others_cpu_s += max(0.0, (cpu1[0] - cpu0[0]) - (cpu1[1] - cpu0[1]))
            self.watched_s += wall

    def over_budget(self) -> bool:
        """The build has spent its timing budget: what is still to choose is compared on one
        repeat of each candidate (a first run alone is no time for a fast kernel: cold caches)."""
        return bool(self.budget_s) and self.seconds >= self.budget_s

    def busy_cores(self) -> float | None:
        """Cores other processes kept busy, on average, while candidates were timed; None when
        nothing was timed (half a second at least) or the machine does not say."""
        return self.others_cpu_s / self.watched_s if self.watched_s >= 0.5 else None

    def summary(self) -> dict:
        """The build report's `measured` entry: programs timed, seconds, and how busy the machine was."""
        out = {"programs": self.programs, "seconds": round(self.seconds, 3), "screened": self.screened,
               "budget_s": self.budget_s, "cut_short": self.cut}
        busy = self.busy_cores()
        if busy is not None:
            out.update(busy_cores=round(busy, 2), busy=busy >= BUSY_CORES)
        return out


def can_measure(target: Target) -> bool:
    """A CPU target is timed where it runs: an RPC device named in the spec, else this machine
    (the CPU scheduler's answer; a GPU's kernels are not timed at build time)."""
    return target.rpc is not None or can_run_here(target)


def where_measured(target: Target) -> str:
    return target.rpc.describe() if target.rpc is not None else "this machine"


WRITTEN_FIRST = "packager.measure.written_first"   # the f_preproc that rewrites the first argument


def _evaluator(lib, name: str, dev, target: Target, number: int, preproc: str | None = None,
               runs: int = COLD_RUNS):
    """TVM's time evaluator for one repeat: `number` warm runs, or `runs` runs each after
    `preproc` (the first argument rewritten, the rest flushed if cold) or after the cache lines of
    the arguments but the first were flushed."""
    if preproc is not None:
        return lib.time_evaluator(name, dev, number=1, repeat=runs, f_preproc=preproc)
    if getattr(target, "cold_weights", False):
        return lib.time_evaluator(name, dev, number=1, repeat=runs, f_preproc=COLD_FLUSH)
    return lib.time_evaluator(name, dev, number=number, repeat=1)


def _load(lib: Library, target: Target):
    """(module, device) where the target's candidates run."""
    if target.rpc is not None:
        from .rpc import load_remote
        return load_remote(lib.modules[0], target)
    return lib, tvm.cpu()


def _args(func: tirx.PrimFunc, rng: np.random.Generator, dev, first=None) -> list:
    """Random tensors for `func`'s parameters (zeros for integers); `first`, when given, is used
    as the first instead of making one."""
    out = [first] if first is not None else []
    for p in func.params[len(out):]:
        shape = [int(d) for d in p.shape]
        dt = str(p.dtype)
        data = rng.standard_normal(shape).astype(dt) if dt.startswith("float") else np.zeros(shape, dt)
        out.append(tvm.runtime.tensor(data, device=dev))
    return out


def _build(funcs: list[tirx.PrimFunc], target: Target, prefix: str, extra: dict | None = None) -> Library:
    """All kernels compiled (on every core here; one module for an RPC device), named prefix0,
    prefix1, ... (and `extra`'s names)."""
    named = {f"{prefix}{i}": f for i, f in enumerate(funcs)}
    named.update(extra or {})
    return build_library(named, tvm.target.Target(target.llvm_target()), parallel=target.rpc is None)


def _copy_kernel(param, target: Target) -> tirx.PrimFunc:
    """dst = src for the first argument's shape, scheduled as the package's element-wise kernels
    are (parallel over the outer axes, vectorized): the producer of the written-first condition."""
    from tvm import te

    from ..rules.cpu import CpuRules

    src = te.placeholder([int(d) for d in param.shape], dtype=str(param.dtype), name="src")
    dst = te.compute(src.shape, lambda *i: src(*i), name="written")
    return CpuRules(target).schedule(te.create_prim_func([src, dst]))[0]


def _written_first(lib, stash, target: Target, copy_name: str = "written_first", name: str = WRITTEN_FIRST) -> str:
    """Registers the f_preproc `name` that flushes the arguments but the first (cold-weights
    targets) and then rewrites the first from `stash` with the module's `copy_name` kernel."""
    flush = tvm.get_global_func(COLD_FLUSH) if getattr(target, "cold_weights", False) else None
    copy = lib[copy_name]

    def preproc(*args):
        if flush is not None:
            flush(*args)
        copy(stash, args[0])

    tvm.register_global_func(name, preproc, override=True)
    return name


def _runs_per_repeat(lib, name: str, dev, args: list) -> int:
    """Runs per timing repeat so that a repeat lasts at least MIN_SECONDS."""
    once = lib.time_evaluator(name, dev, number=1, repeat=1, min_repeat_ms=1)(*args).mean
    return max(1, int(MIN_SECONDS / max(once, 1e-6)))


def time_candidates(funcs: list[tirx.PrimFunc], target: Target, repeat: int = 3,
                    time_first: bool = True, tally: Tally | None = None) -> list[float | None]:
    """Seconds per run for each candidate (None: wrong result or failed), same order. The first
    is the correctness reference; with `time_first` off it is only run (its time is None).

    Timing is interleaved rounds with early pruning: every correct candidate gets one repeat,
    then only those within PRUNE of the fastest so far get the next; a pruned candidate keeps its
    (upper-bound) time. The winner still gets `repeat` repeats, spread over the whole call so a
    noisy second hits every close candidate alike, and the clearly slower ones cost one repeat.
    What it cost goes into `tally` (the build's), when given."""
    tally = tally if tally is not None else Tally()
    t0 = tally.start()
    local = target.rpc is None and bool(funcs[0].params)
    extra = {"written_first": _copy_kernel(funcs[0].params[0], target)} if local else None
    lib, dev = _load(_build(funcs, target, "c", extra), target)
    rng = np.random.default_rng(0)
    args = _args(funcs[0], rng, dev)
    inputs = [a.numpy() for a in args]
    preproc = _written_first(lib, tvm.runtime.tensor(inputs[0], device=dev), target) if local else None
    ref, half = None, rounds_through_half(funcs[0])
    correct: list[int] = []
    first: dict[int, float] = {}                  # each correctness run's wall time
    for i in range(len(funcs)):
        for a, x in zip(args, inputs):
            a.copyfrom(x)
        dev.sync()
        t_run = time.perf_counter()
        lib[f"c{i}"](*args)
        dev.sync()
        first[i] = time.perf_counter() - t_run
        out = args[-1].numpy()
        if ref is None:
            ref = out
            if not time_first:
                continue
        elif not (agree(out, ref, half=True) if half else np.allclose(out, ref, rtol=1e-4, atol=1e-4)):
            continue
        correct.append(i)
    timed, screened, runs = screen({i: first[i] for i in correct})
    if tally.over_budget():                       # the build's timing budget is spent: one short repeat each
        repeat, runs = 1, 1
        tally.cut += 1
    best = _timed_rounds(lib, dev, args, timed, repeat, target, preproc, runs)
    best.update(screened)
    tally.screened += len(screened)
    tally.add(len(funcs) - (0 if time_first else 1), t0)
    return [best.get(i) for i in range(len(funcs))]


def screen(first: dict[int, float]) -> tuple[list[int], dict[int, float], int]:
    """(candidates to time, the screened ones with their first run's time as their time, runs per
    repeat): all of them at COLD_RUNS when the fastest first run is under SLOW_SECONDS; else those
    within SCREEN of it, at one run per repeat."""
    fastest = min(first.values(), default=0.0)
    if fastest < SLOW_SECONDS:
        return list(first), {}, COLD_RUNS
    return ([i for i, t in first.items() if t <= SCREEN * fastest],
            {i: t for i, t in first.items() if t > SCREEN * fastest}, 1)


def _timed_rounds(lib, dev, args: list, which: list[int], rounds: int, target: Target,
                  preproc: str | None = None, runs: int = COLD_RUNS) -> dict[int, float]:
    """Fastest repeat per candidate over interleaved rounds, pruning the clearly slower ones."""
    number = {i: 1 if preproc else _runs_per_repeat(lib, f"c{i}", dev, args) for i in which}
    best = {i: float("inf") for i in which}
    alive = list(which)
    for _ in range(rounds):
        for i in alive:
            ev = _evaluator(lib, f"c{i}", dev, target, number[i], preproc, runs)
            best[i] = min(best[i], min(ev(*args).results))
        fastest = min(best.values(), default=0.0)
        alive = [i for i in alive if best[i] <= PRUNE * fastest]
    return best


def time_interleaved(funcs: list[tirx.PrimFunc], target: Target, rounds: int = 3,
                     repeat: int = 2, tally: Tally | None = None, written_first: bool = False) -> list[float | None]:
    """Seconds per run of different kernels (each on its own random inputs), timed in
    alternation for `rounds` rounds and the minimum kept per kernel: on a machine whose
    neighbours slow it for seconds at a time, kernels compared with each other (a merged kernel
    and the kernels it replaces) see the same slow and quiet periods (one repeat each once the
    build's timing budget is spent). `written_first`: each run after its first argument was
    rewritten, as time_candidates times a kernel's plans (this machine only). None: failed to run."""
    tally = tally if tally is not None else Tally()
    t0 = tally.start()
    written_first = written_first and target.rpc is None and all(f.params for f in funcs)
    extra = {f"w{i}": _copy_kernel(f.params[0], target) for i, f in enumerate(funcs)} if written_first else None
    lib, dev = _load(_build(funcs, target, "k", extra), target)
    rng = np.random.default_rng(0)
    args = [_args(f, rng, dev) for f in funcs]
    best: list[float | None] = [None] * len(funcs)
    number = [1] * len(funcs)
    preproc: list[str | None] = [None] * len(funcs)
    for i in range(len(funcs)):
        try:
            if written_first:
                stash = tvm.runtime.tensor(args[i][0].numpy(), device=dev)
                preproc[i] = _written_first(lib, stash, target, f"w{i}", f"{WRITTEN_FIRST}.{i}")
            else:
                number[i] = _runs_per_repeat(lib, f"k{i}", dev, args[i])
        except Exception:  # noqa: BLE001 - a kernel that fails to run is reported as untimed
            continue
        best[i] = float("inf")
    if tally.over_budget():                       # the build's timing budget is spent: one repeat each
        rounds = repeat = 1
        tally.cut += 1
    for _ in range(rounds):
        for i in range(len(funcs)):
            if best[i] is not None:
                for _ in range(repeat):
                    ev = _evaluator(lib, f"k{i}", dev, target, number[i], preproc[i])
                    best[i] = min(best[i], min(ev(*args[i]).results))
    tally.add(len(funcs), t0)
    return best
