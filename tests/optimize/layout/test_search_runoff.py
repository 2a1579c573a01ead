"""The layout search's run-off (search.py): candidates within RUNOFF_WITHIN of the best are timed
again together and those times decide; run-off times within TIE settle on the preferred layout
(the producer's block kept, vector-wide output blocks); a conv's and a matmul's run-off is
recorded and replayed from the database."""
from __future__ import annotations

import numpy as np

from packager.optimize.layout.matmul import MatmulSite
from packager.optimize.layout.search import RUNOFF_WITHIN, LayoutSearch
from packager.optimize.layout.sites import ConvSite
from packager.optimize.schedule.registry import scheduler_for
from packager.spec import OptimizeSpec

from support.kernel_cases import host_target, scheduler
from test_propagate import X86

SITE = ConvSite((1, 32, 14, 14), (64, 32, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, "float32")


class RunoffSearch(LayoutSearch):
    """Real decisions over fixed first timings (`first`, by "data/out" key) and run-off times
    (`again`), as if measured; `retimed` lists the candidates timed again."""

    def __init__(self, database, first: dict[str, float], again: dict[str, float]):
        super().__init__(scheduler_for(X86, OptimizeSpec(database=database, measure=False)))
        self.lanes = 16
        self.first, self.again, self.retimed = first, again, []

    def _conversion_ms(self, site, src, dst):
        return 0.0

    @property
    def measuring(self) -> bool:
        return True

    def _score(self, site, data_block, out_block):
        return self.first.get(f"{data_block}/{out_block}", float("inf"))

    def _score_func(self, func, name=""):
        return self.first[name.rsplit("=", 1)[1]]

    def _time_together(self, funcs, names):
        keys = [n.rsplit(" ", 1)[1].removeprefix("n_t=") for n in names]
        self.retimed += keys
        return [self.again[k] for k in keys]


def test_the_run_off_decides_between_close_candidates(tmp_path):
    """16/32 timed 1.2x slower at first but faster together: the run-off's times decide; 16/1,
    beyond RUNOFF_WITHIN, is not timed again and moves with the best (x0.5 here)."""
    first = {"16/1": 1.0 * RUNOFF_WITHIN + 0.1, "16/16": 1.0, "16/32": 1.2}
    s = RunoffSearch(tmp_path, first, {"16/16": 0.5, "16/32": 0.4})
    d = s.decide(SITE, 16)
    assert sorted(s.retimed) == ["16/16", "16/32"]
    assert (d.data_block, d.out_block) == (16, 32)
    assert d.scores == {"16/1": round(first["16/1"] * 0.5, 4), "16/16": 0.5, "16/32": 0.4}
    assert d.runoff == {"16/16": 1.0, "16/32": 1.2} and d.changed_by_runoff


def test_near_equal_run_off_times_take_the_preferred_layout(tmp_path):
    """Within TIE of each other, the candidate keeping the producer's 16-channel block and writing
    16-channel blocks wins, whichever timed a hair faster; 3% apart it is a win again."""
    first = {"16/1": 1.0, "16/16": 1.01, "16/32": 1.02}
    tied = RunoffSearch(tmp_path / "a", first, {"16/1": 0.99, "16/16": 1.0, "16/32": 0.995}).decide(SITE, 16)
    assert tied.out_block == 16
    clear = RunoffSearch(tmp_path / "b", first, {"16/1": 0.9, "16/16": 1.0, "16/32": 0.995}).decide(SITE, 16)
    assert clear.out_block == 1


def test_one_close_candidate_has_no_run_off(tmp_path):
    s = RunoffSearch(tmp_path, {"16/1": 2.0, "16/16": 1.0, "16/32": 1.5}, {})
    d = s.decide(SITE, 16)
    assert d.out_block == 16 and not s.retimed and not d.runoff and not d.changed_by_runoff


def test_a_run_off_is_recorded_and_replayed(tmp_path):
    first = {"16/1": 1.1, "16/16": 1.0, "16/32": 1.2}
    s = RunoffSearch(tmp_path, first, {"16/1": 0.6, "16/16": 0.7, "16/32": 0.8})
    assert s.decide(SITE, 16).out_block == 1
    s.save()
    again = RunoffSearch(tmp_path, first, {})
    d = again.decide(SITE, 16)
    assert d.reused and d.out_block == 1 and d.runoff == first and not again.retimed


def test_matmul_panels_take_the_run_off_too(tmp_path):
    """Row-major timed slow at first (ViT-tiny's MLP matmul: 0.28 ms, 0.15 in other builds),
    fastest when timed together; n_t = 64, beyond RUNOFF_WITHIN, is not timed again."""
    site = MatmulSite((197, 192), 768, "float32")
    first = {"0": 0.28, "16": 0.25, "32": 0.22, "64": 0.4}
    s = RunoffSearch(tmp_path, first, {"0": 0.15, "16": 0.2, "32": 0.21})
    d = s.decide_matmul(site)
    assert sorted(s.retimed) == ["0", "16", "32"]
    assert d.nt == 0 and d.runoff == {"0": 0.28, "16": 0.25, "32": 0.22} and d.changed_by_runoff
    s.save()
    assert RunoffSearch(tmp_path, first, {}).decide_matmul(site).runoff == d.runoff


def test_candidates_are_timed_together_on_this_machine(tmp_path):
    """The real run-off: each candidate's chosen schedule, timed in one interleaved call."""
    search = LayoutSearch(scheduler(host_target(), tmp_path, measure=True))
    search._scores(SITE, 16, [(16, 16), (16, 32)])
    ms = search._time_together([SITE.kernel(16, 16), SITE.kernel(16, 32)], ["a 16/16", "a 16/32"])
    assert len(ms) == 2 and all(t is not None and np.isfinite(t) and t > 0 for t in ms)
