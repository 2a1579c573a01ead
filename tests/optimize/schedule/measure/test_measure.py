"""Timing kernels on this machine: kernels with different signatures timed in alternation come
back in order, each with its own inputs. No test here compares two measured times: what is
asserted is what the timing does (which runs, on what, flushed or not), which no load can flip."""
from __future__ import annotations

import pytest
from tvm import te

from support.kernel_cases import host_target
from packager.optimize.schedule.measure.timing import Tally, time_candidates, time_interleaved
from packager.optimize.schedule.rules.cpu import CpuRules


def _matmul(n: int):
    a = te.placeholder((n, n), name="a")
    b = te.placeholder((n, n), name="b")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="matmul")
    return te.create_prim_func([a, b, c])


def test_interleaved_times_come_back_in_order_each_with_its_own_inputs(monkeypatch):
    """Kernels of different signatures timed in alternation: each is run on arguments of its own
    shapes, and its time comes back at its own position (the module is real, the clock is not:
    tests assert what is done, never which of two measured times is smaller)."""
    import packager.optimize.schedule.measure.timing as measure

    target = host_target()
    rules = CpuRules(target)
    small, big = (rules.schedule(_matmul(n))[0] for n in (32, 128))
    seen: dict[str, set] = {}

    class Timed:
        def __init__(self, lib):
            self.lib = lib

        def __getitem__(self, name):
            return self.lib[name]

        def time_evaluator(self, name, dev, number=1, repeat=1, min_repeat_ms=0):
            def run(*args):
                seen.setdefault(name, set()).add(tuple(a.shape for a in args))
                self.lib[name](*args)                               # the real kernel on these args
                return type("R", (), {"results": [float(name[1:]) + 1.0] * repeat, "mean": 1.0})()
            return run

    real_load = measure._load

    def load(lib, t):
        lib, dev = real_load(lib, t)
        return Timed(lib), dev

    monkeypatch.setattr(measure, "_load", load)
    tally = Tally()
    t_big, t_small = time_interleaved([big, small], target, rounds=2, repeat=1, tally=tally)
    assert (t_big, t_small) == (1.0, 2.0)                             # k0 -> 1.0, k1 -> 2.0: in order
    assert seen == {"k0": {((128, 128),) * 3}, "k1": {((32, 32),) * 3}}
    assert tally.programs == 2


def test_the_tally_counts_timed_candidates_only():
    """The build report's `measured.programs`: an untimed correctness reference is not counted."""
    target = host_target()
    f = CpuRules(target).schedule(_matmul(32))[0]
    tally = Tally()
    times = time_candidates([f, f, f], target, repeat=1, time_first=False, tally=tally)
    assert times[0] is None and all(t > 0 for t in times[1:])
    assert tally.programs == 2 and tally.seconds > 0 and tally.summary()["programs"] == 2


def test_past_the_budget_candidates_get_one_repeat(monkeypatch):
    """A build whose timing budget is spent still runs every candidate against the reference (a
    wrong one is None) and times each with one repeat of one run (not 3 rounds), and the build
    counts the kernel as cut short."""
    import packager.optimize.schedule.measure.timing as measure

    target = host_target()
    f = CpuRules(target).schedule(_matmul(32))[0]
    tally = Tally(seconds=10.0, budget_s=5.0)
    assert tally.over_budget() and not Tally(seconds=10.0).over_budget()
    real_rounds, seen = measure._timed_rounds, []
    monkeypatch.setattr(measure, "_timed_rounds",
                        lambda lib, dev, args, which, rounds, *a: seen.append((rounds, a[-1])) or
                        real_rounds(lib, dev, args, which, rounds, *a))
    times = time_candidates([f, f], target, tally=tally)
    assert seen == [(1, 1)]
    assert all(t is not None and t > 0 for t in times)
    assert tally.cut == 1 and tally.summary()["cut_short"] == 1
    calls = []
    real = measure._evaluator
    monkeypatch.setattr(measure, "_evaluator", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    assert all(t > 0 for t in time_interleaved([f, f], target, rounds=3, repeat=2, tally=tally))
    assert sorted(calls) == ["k0", "k1"] and tally.cut == 2       # one repeat each, not 3 x 2


class _FakeLib:
    """Kernel i takes SECONDS[i] per run; records how many repeats each kernel was timed."""

    SECONDS = {0: 1.0, 1: 1.1, 2: 2.0, 3: 1.3}

    def __init__(self):
        self.repeats: dict[int, int] = {}

    def time_evaluator(self, name, dev, number=1, repeat=1, min_repeat_ms=0):
        i = int(name[1:])

        def run(*args):
            self.repeats[i] = self.repeats.get(i, 0) + repeat
            return type("R", (), {"results": [self.SECONDS[i]] * repeat, "mean": self.SECONDS[i]})()
        return run


def test_clearly_slower_candidates_get_one_repeat():
    """Candidates more than PRUNE x the fastest after a round are not timed again; the close ones
    get every round (the first extra call per kernel sizes the repeat)."""
    from packager.optimize.schedule.measure.timing import PRUNE, _timed_rounds
    lib = _FakeLib()
    best = _timed_rounds(lib, None, [], [0, 1, 2, 3], rounds=3, target=host_target())
    assert best == lib.SECONDS
    slow = [i for i, s in lib.SECONDS.items() if s > PRUNE * 1.0]
    assert slow == [2, 3]
    assert all(lib.repeats[i] == 1 + 3 for i in (0, 1))         # sizing run + 3 rounds
    assert all(lib.repeats[i] == 1 + 1 for i in slow)            # sizing run + 1 round


def test_weights_over_the_last_level_cache_are_timed_cold():
    """A model whose weights exceed the cache is timed with the caches flushed before every run
    (its kernels read their weights from DRAM in the package): only targets timed here are
    marked, their records are keyed apart, and a cold target's runs are each timed after a flush."""
    from packager.optimize.schedule.hardware import last_level_cache
    from packager.optimize.schedule.registry import scheduler_for
    from packager.spec import TargetSpec
    from packager.targets import resolve

    host, arm = host_target(), resolve(TargetSpec("arm64", {}, "a"))   # arm64 runs under qemu: not timed
    h100 = resolve(TargetSpec("h100", {}, "g"))                          # a GPU is not timed at build time
    llc = last_level_cache(host)
    assert scheduler_for(host).with_cold_weights(llc // 2) == host
    cold, arm_after, gpu_after = (scheduler_for(t).with_cold_weights(2 * llc) for t in (host, arm, h100))
    assert cold.cold_weights and not getattr(arm_after, "cold_weights", False) and gpu_after == h100
    assert scheduler_for(cold).target_key() != scheduler_for(host).target_key()

    # the flush really happens: a cold target's runs are timed one at a time after TVM's clflush
    # of every argument but the first, a warm one's back to back (the mechanism, not the clock)
    import tvm

    from packager.optimize.schedule.measure.timing import COLD_FLUSH, COLD_RUNS, _evaluator

    calls = []

    class Lib:
        def time_evaluator(self, name, dev, **kw):
            calls.append(kw)

    _evaluator(Lib(), "c0", None, host, 7)
    _evaluator(Lib(), "c0", None, cold, 7)
    assert calls == [{"number": 7, "repeat": 1}, {"number": 1, "repeat": COLD_RUNS, "f_preproc": COLD_FLUSH}]
    assert tvm.get_global_func(COLD_FLUSH) is not None               # the runtime has the flush


def test_every_timed_run_starts_with_the_first_argument_just_written():
    """As in the package, where the previous kernel has just written a kernel's activation on all
    cores: before each timed run the first argument is rewritten from its original values. A
    kernel that adds 1 to its first argument in place therefore sees the original every run
    (without the rewrite, the last of COLD_RUNS runs would see 4 more)."""
    import numpy as np
    import tvm
    from tvm.script import tirx as T

    from packager.optimize.schedule.measure.timing import COLD_RUNS, _build, _copy_kernel, _evaluator, _written_first

    @T.prim_func
    def bump(a: T.Buffer((256,), "float32"), out: T.Buffer((256,), "float32")):
        for i in range(256):
            a[i] = a[i] + T.float32(1.0)
            out[i] = a[i]

    host = host_target()
    lib = _build([bump], host, "c", {"written_first": _copy_kernel(bump.params[0], host)})
    dev = tvm.cpu()
    a, out = (tvm.runtime.tensor(np.zeros(256, "float32"), device=dev) for _ in range(2))
    stash = tvm.runtime.tensor(np.full(256, 7.0, "float32"), device=dev)
    result = _evaluator(lib, "c0", dev, host, 1, _written_first(lib, stash, host))(a, out)
    assert len(result.results) == COLD_RUNS > 1
    assert np.all(out.numpy() == 8.0) and np.all(a.numpy() == 8.0)


def test_weight_bytes_count_initializers():
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from packager.frontend.model import weight_bytes

    inits = [numpy_helper.from_array(np.zeros((3, 5), np.float32), "w"),
             numpy_helper.from_array(np.zeros(7, np.int64), "i")]
    g = helper.make_graph([], "g", [], [helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 5])], inits)
    assert weight_bytes(helper.make_model(g)) == 3 * 5 * 4 + 7 * 8


def test_the_tally_sees_other_processes_busy_while_it_times():
    """A busy loop in another process during a timing window counts as a busy core (the build
    then says its timings were taken on a busy machine)."""
    import subprocess
    import sys
    import time

    from packager.optimize.schedule.measure.timing import Tally

    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)                                  # the loop is running
        tally = Tally()
        since = tally.start()
        time.sleep(1.0)
        tally.add(0, since)
    finally:
        loop.kill()
    assert tally.busy_cores() > 0.5 and tally.summary()["busy"] and Tally().busy_cores() is None


def test_slow_candidates_are_screened_by_their_first_run():
    """Fast kernels keep the full repeat counts; when the fastest first (correctness) run took
    SLOW_SECONDS or more, candidates SCREEN x slower are not timed again (their first run is their
    time) and the rest get one run per repeat."""
    from packager.optimize.schedule.measure.timing import COLD_RUNS, SCREEN, SLOW_SECONDS, screen

    fast = {0: SLOW_SECONDS / 10, 1: SLOW_SECONDS / 2, 2: SLOW_SECONDS * 3}
    assert screen(fast) == ([0, 1, 2], {}, COLD_RUNS)
    slow = {0: 0.5, 1: 0.5 * SCREEN, 2: 0.5 * SCREEN + 0.01, 3: 0.6}
    assert screen(slow) == ([0, 1, 3], {2: 0.5 * SCREEN + 0.01}, 1)
    assert screen({}) == ([], {}, COLD_RUNS)


def test_interleaved_kernels_can_run_with_their_input_just_written(monkeypatch):
    """`written_first`: each run of each kernel comes after its own first argument was rewritten
    by a copy kernel of that argument's shape (the condition Gensor's plans are timed in), one run
    per evaluation; without it, warm repeats of several runs."""
    import packager.optimize.schedule.measure.timing as measure

    target = host_target()
    rules = CpuRules(target)
    small, big = (rules.schedule(_matmul(n))[0] for n in (32, 128))
    calls = []
    real = measure._evaluator
    monkeypatch.setattr(measure, "_evaluator", lambda *a, **k: calls.append((a[1], a[4], a[5:])) or real(*a, **k))
    times = time_interleaved([big, small], target, rounds=1, repeat=1, written_first=True)
    assert all(t is not None and t > 0 for t in times)
    assert calls == [("k0", 1, (f"{measure.WRITTEN_FIRST}.0",)), ("k1", 1, (f"{measure.WRITTEN_FIRST}.1",))]
    calls.clear()
    time_interleaved([big, small], target, rounds=1, repeat=1)
    assert [(name, rest) for name, _, rest in calls] == [("k0", (None,)), ("k1", (None,))]
