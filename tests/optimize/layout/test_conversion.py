"""What the layout search charges for converting a tensor between channel blocks (conversion.py):
the conversion kernel is the layout change it stands for, timed once per shape where the target
is timed and kept in the database, else estimated from the cache level the tensor lives in."""
from __future__ import annotations

import numpy as np

from packager.optimize.layout.conversion import ConversionCost, conversion_func
from packager.optimize.layout.search import LayoutSearch
from packager.optimize.layout.sites import ConvSite
from packager.optimize.schedule.hardware import last_level_cache

from support.kernel_cases import host_target, run_kernel, scheduler
from test_propagate import X86


def test_the_conversion_kernel_reblocks_channels():
    x = np.random.default_rng(0).standard_normal((1, 32, 5, 3)).astype("float32")
    blocked = run_kernel(conversion_func(x.shape, "float32", 1, 16), X86, [x, np.zeros((1, 2, 5, 3, 16), "float32")])
    np.testing.assert_array_equal(blocked, x.reshape(1, 2, 16, 5, 3).transpose(0, 1, 3, 4, 2))
    back = run_kernel(conversion_func(x.shape, "float32", 16, 8), X86, [blocked, np.zeros((1, 4, 5, 3, 8), "float32")])
    np.testing.assert_array_equal(back, x.reshape(1, 4, 8, 5, 3).transpose(0, 1, 3, 4, 2))


def test_a_tensor_in_the_last_level_cache_is_charged_at_its_speed(tmp_path):
    """Untimed: a tensor whose read and write fit in the last-level cache costs a few times less
    than one that streams from DRAM (per byte)."""
    cost = ConversionCost(scheduler(X86, tmp_path, measure=False), None, "t", measuring=False)
    small = (1, 48, 112, 112)
    channels = 2 * last_level_cache(X86) // (112 * 112 * 4)
    large = (1, channels, 112, 112)
    per_byte = [cost.ms(s, "float32", 1, 16) / np.prod(s) for s in (small, large)]
    assert per_byte[0] * 2 < per_byte[1]
    assert cost.ms(small, "float32", 16, 16) == 0.0 and cost.counts["timed"] == 0


class _Timed:
    """A scheduler stand-in that times every kernel at 0.05 ms and counts the calls."""

    def __init__(self, real):
        self.real, self.target, self.calls = real, real.target, 0

    def hardware(self):
        return self.real.hardware()

    def scheduled(self, func):
        return self.real.scheduled(func)

    def time(self, funcs, written_first=False):
        assert written_first                       # the producer has just written the tensor
        self.calls += 1
        return [5e-5 for _ in funcs]


def test_a_timed_conversion_is_kept_in_the_database_and_replayed(tmp_path):
    real = scheduler(host_target(), tmp_path)
    timed = _Timed(real)
    first = ConversionCost(timed, real.database(), real.target_key(), measuring=True)
    assert first.ms((1, 32, 56, 56), "float32", 1, 16) == 0.05 and first.counts["timed"] == 1
    first.db.save()
    again = ConversionCost(timed, scheduler(host_target(), tmp_path).database(), real.target_key(), measuring=True)
    assert again.ms((1, 32, 56, 56), "float32", 1, 16) == 0.05 and again.counts["timed"] == 0 and timed.calls == 1


def test_a_candidate_converting_its_input_pays_the_charge(tmp_path):
    """After an NCHW producer a conv's 16-channel input candidate pays the conversion, the NCHW
    one does not."""
    site = ConvSite((1, 32, 28, 28), (32, 1, 3, 3), (1, 1), (1,) * 4, (1, 1), 32, "float32")

    class Flat(LayoutSearch):
        def _score(self, s, data_block, out_block):
            return 1.0

    search = Flat(scheduler(X86, tmp_path, measure=False))
    scores = search._scores(site, 1, [(1, 16), (16, 16)])
    charge = search.conversions.estimate_ms(site.data, "float32")
    assert scores["1/16"] == 1.0 and abs(scores["16/16"] - (1.0 + charge)) < 1e-4 and charge > 0
