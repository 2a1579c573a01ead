"""Timing chains of kernels (measure/chain.py): each kernel reads the previous one's output, the
chain's input is rewritten before every run and only the weights are flushed. What is asserted is
what the timing does, never which of two measured times is smaller."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from support.kernel_cases import host_target
from packager.optimize.schedule.measure import chain as measure
from packager.optimize.schedule.measure.timing import Tally
from packager.optimize.schedule.rules.cpu import CpuRules

FLUSH = "packager.test.chain_flush"


def _scaled(n: int):
    x = te.placeholder((n, n), name="x")
    return te.create_prim_func([x, te.compute((n, n), lambda i, j: x[i, j] * 2.0, name="y")])


def _plus_weight(n: int):
    y = te.placeholder((n, n), name="y")
    w = te.placeholder((n, n), name="w")
    return te.create_prim_func([y, w, te.compute((n, n), lambda i, j: y[i, j] + w[i, j], name="z")])


def _scheduled(*funcs):
    rules = CpuRules(host_target())
    return [rules.schedule(f)[0] for f in funcs]


@pytest.fixture
def flushed(monkeypatch):
    """The shapes of the tensors each flush was asked to flush (its first argument is skipped)."""
    seen: list[tuple] = []
    tvm.register_global_func(FLUSH, lambda *args: seen.append(tuple(tuple(a.shape) for a in args[1:])),
                             override=True)
    monkeypatch.setattr(measure, "COLD_FLUSH", FLUSH)
    return seen


def test_a_chain_runs_wired_output_to_input_with_only_its_weights_flushed(monkeypatch, flushed):
    runs: list = []
    real = measure._Chain.run

    def run(self, flush):
        first = self.args[0][0]
        first.copyfrom(np.zeros(first.shape, first.dtype))             # what a kernel could leave there
        seconds = real(self, flush)
        runs.append(self)
        return seconds

    monkeypatch.setattr(measure._Chain, "run", run)
    tally = Tally()
    times = measure.time_chains([_scheduled(_plus_weight(8)), _scheduled(_scaled(16), _plus_weight(16))],
                                host_target(), rounds=2, tally=tally)
    assert all(t is not None and t > 0 for t in times) and tally.programs == 3
    assert set(flushed) == {((8, 8),), ((16, 16),)}                  # the weights, never an input or output
    chained = runs[-1]
    assert chained.args[1][0] is chained.args[0][-1]                 # the second kernel reads the first's output
    x, w, z = (t.numpy() for t in (chained.stash, chained.args[1][1], chained.args[1][2]))
    assert np.abs(x).sum() > 0
    np.testing.assert_allclose(z, 2 * x + w, rtol=1e-6)              # computed from the input rewritten


def test_a_chain_without_weights_flushes_nothing(flushed):
    made = measure.time_chains([_scheduled(_scaled(16))], host_target(), rounds=1)
    assert made[0] is not None and flushed == []


def test_a_chain_that_does_not_wire_is_refused():
    with pytest.raises(ValueError, match="not the previous kernel's output"):
        measure.time_chains([_scheduled(_scaled(16), _plus_weight(8))], host_target(), rounds=1)


def test_an_rpc_target_sums_each_chain_of_kernels_timed_there(monkeypatch):
    """A board's kernels are timed one by one on it (time_interleaved) and summed per chain; a
    kernel that failed there fails its chain."""
    from dataclasses import replace

    from packager.targets.table import RpcDevice

    seen = []

    def remote(funcs, target, rounds, tally=None):
        seen.append((len(funcs), target.rpc is not None))
        return [1.0, 2.0, 4.0, None, 8.0]

    monkeypatch.setattr(measure, "time_interleaved", remote)
    board = replace(host_target(), rpc=RpcDevice("127.0.0.1", 9190, "board"))
    one, two = _scheduled(_scaled(8)), _scheduled(_scaled(8), _plus_weight(8))
    assert measure.time_chains([one, two, two], board) == [1.0, 6.0, None]
    assert seen == [(5, True)]
