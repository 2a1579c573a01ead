"""The tuning database file: one parse per file version per process, writes seen by every reader,
and the text stays JSON with one record per line."""
from __future__ import annotations

import json
import os

from packager.optimize.schedule.measure import database
from packager.optimize.schedule.measure.database import TuningDatabase


def test_instances_share_one_parse_until_the_file_changes(tmp_path, monkeypatch):
    a = TuningDatabase(tmp_path)
    a.put("k1", {"measured": True}, "layout", "x86-64")
    a.save()
    parses = []
    real = json.loads
    monkeypatch.setattr(database.json, "loads", lambda s: parses.append(1) or real(s))
    b, c = TuningDatabase(tmp_path), TuningDatabase(tmp_path)
    assert b.get("k1", kind="layout") and c.get("k1", kind="layout")
    assert parses == []                            # the writer's own records were kept, not re-read

    other = json.loads((tmp_path / "tuning.json").read_text())    # another process adds a record
    other["records"]["k2"] = {**other["records"]["k1"], "measured": False}
    (tmp_path / "tuning.json").write_text(json.dumps(other))
    os.utime(tmp_path / "tuning.json", ns=(1, 1))
    parses.clear()
    d = TuningDatabase(tmp_path)
    assert parses == [1] and d.get("k2", kind="layout") is not None
    assert b.get("k2") is None                     # an open instance keeps the records it read


def test_the_file_is_json_with_one_record_per_line(tmp_path):
    db = TuningDatabase(tmp_path)
    for k in ("b", "a", "c"):
        db.put(k, {"measured": True, "s": 1.5}, "derive", "x86-64")
    db.save()
    text = (tmp_path / "tuning.json").read_text()
    assert list(json.loads(text)["records"]) == ["a", "b", "c"]
    body = text.splitlines()[1:-1]
    assert len(body) == 3 and body[0].startswith('"a": {')


def test_an_update_does_not_change_records_another_instance_holds(tmp_path):
    a = TuningDatabase(tmp_path)
    a.put("k1", {"measured": True}, "layout", "x86-64")
    a.save()
    held = TuningDatabase(tmp_path)
    writer = TuningDatabase(tmp_path)
    writer.update(lambda records: records.pop("k1"))
    assert held.get("k1") is not None and writer.get("k1") is None
