"""Trial schedules (trial.py): a fusion that would cost the grown kernel its schedule is refused."""
from __future__ import annotations

from packager.optimize.globalfuse.trial import keeps_schedule


def test_trial_refuses_a_fusion_that_loses_the_schedule():
    assert keeps_schedule("tiled-reduction", "tiled-reduction")
    assert not keeps_schedule("tiled-reduction", "fallback")
    assert not keeps_schedule("injective", "tiled-reduction")
    assert keeps_schedule("naive", "injective")
    assert not keeps_schedule("naive", "naive")
