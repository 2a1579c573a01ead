"""Timing merged kernels (timing.py): decisions are kept in the tuning database and replayed,
older rules are measured again, and a tie goes to the merged kernel."""
from __future__ import annotations

from support.globalfuse_cases import optimized, report_of


def test_row_region_decisions_come_back_from_the_tuning_database(transformer, tmp_path):
    """The first build times the merged softmax @ V against its parts and records it; a rebuild
    takes the recorded decision (here flipped by hand) instead of timing again."""
    import json

    _, reports = optimized(transformer, measure=True, database=tmp_path)
    rows = report_of(reports, "global_fusion").details["row_regions"]
    db = tmp_path / "tuning.json"
    data = json.loads(db.read_text())
    recs = [r for r in data["records"].values() if "fused_s" in r]
    assert len(recs) >= 1 + len(report_of(reports, "global_fusion").details["measured"])
    # only the row regions' decisions flip: a flipped copy fold would change the kernels around them
    for r in (r for r in recs if r["fusion"] == "row region"):
        r["fused_s"], r["separate_s"] = (2.0, 1.0) if rows["taken"] else (1.0, 2.0)
    db.write_text(json.dumps(data))
    _, again = optimized(transformer, measure=True, database=tmp_path)
    flipped = report_of(again, "global_fusion").details["row_regions"]
    assert flipped["taken"] == 1 - rows["taken"]
    if rows["taken"]:
        assert list(flipped["refused"].values()) == ["slower when measured: 2000000 vs 1000000 us"]


def test_decisions_of_older_rules_are_measured_again(transformer, tmp_path, monkeypatch):
    """A recorded decision is keyed by DECISIONS_VERSION: after a rule change (the version
    bumped) the rebuild times the merged kernels again instead of replaying the old decision."""
    import json

    from packager.optimize.globalfuse import timing

    optimized(transformer, measure=True, database=tmp_path)
    db = tmp_path / "tuning.json"
    data = json.loads(db.read_text())
    old = {k: r for k, r in data["records"].items() if "fused_s" in r}
    assert old
    for r in old.values():
        r["fused_s"], r["separate_s"] = 2.0, 1.0                 # a stale "refused" for everything
    db.write_text(json.dumps(data))
    monkeypatch.setattr(timing, "DECISIONS_VERSION", timing.DECISIONS_VERSION + 1)
    _, again = optimized(transformer, measure=True, database=tmp_path)
    details = report_of(again, "global_fusion").details
    reasons = [*details["row_regions"]["refused"].values(), *details["refused"].values()]
    assert not any("2000000 vs 1000000" in why for why in reasons)
    fresh = {k for k, r in json.loads(db.read_text())["records"].items() if "fused_s" in r} - set(old)
    assert fresh                                   # timed again: new records, under the new version


def test_a_measured_tie_goes_to_the_merged_kernel():
    """Within the timer's resolution the merged kernel (fewer bytes, one step less) is kept;
    beyond it the measurement refuses."""
    from packager.optimize.globalfuse.timing import TIMER_RESOLUTION, pays

    assert pays(0.9, 1.0) and pays(1.0, 1.0) and pays(1.0 + TIMER_RESOLUTION / 2, 1.0)
    assert not pays(1.0 + 2 * TIMER_RESOLUTION, 1.0) and not pays(2.0, 1.0)
