"""Timing kernels on this machine: kernels with different signatures timed in alternation come
back in order, each with its own inputs."""
from __future__ import annotations

from tvm import te

from support.kernel_cases import host_target
from packager.optimize.schedule.measure import TALLY, time_candidates, time_interleaved
from packager.optimize.schedule.rules_cpu import CpuRules


def _matmul(n: int):
    a = te.placeholder((n, n), name="a")
    b = te.placeholder((n, n), name="b")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="matmul")
    return te.create_prim_func([a, b, c])


def test_interleaved_times_follow_the_work():
    """A 64x bigger matmul (different shapes, so different inputs) is timed slower, in order."""
    target = host_target()
    rules = CpuRules(target)
    small, big = (rules.schedule(_matmul(n))[0] for n in (32, 128))
    before = TALLY.programs
    t_big, t_small = time_interleaved([big, small], target, rounds=2, repeat=1)
    assert 0 < t_small < t_big
    assert TALLY.programs == before + 2


def test_the_tally_counts_timed_candidates_only():
    """The build report's `measured.programs`: an untimed correctness reference is not counted."""
    target = host_target()
    f = CpuRules(target).schedule(_matmul(32))[0]
    before, seconds = TALLY.programs, TALLY.seconds
    times = time_candidates([f, f, f], target, repeat=1, time_first=False)
    assert times[0] is None and all(t > 0 for t in times[1:])
    assert TALLY.programs == before + 2 and TALLY.seconds > seconds


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
    from packager.optimize.schedule.measure import PRUNE, _timed_rounds
    lib = _FakeLib()
    best = _timed_rounds(lib, None, [], [0, 1, 2, 3], rounds=3)
    assert best == lib.SECONDS
    slow = [i for i, s in lib.SECONDS.items() if s > PRUNE * 1.0]
    assert slow == [2, 3]
    assert all(lib.repeats[i] == 1 + 3 for i in (0, 1))         # sizing run + 3 rounds
    assert all(lib.repeats[i] == 1 + 1 for i in slow)            # sizing run + 1 round
