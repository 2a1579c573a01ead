"""The tuning database and `pack tuning`: records know what produced them and under which rules
version (stale ones are not replayed), concurrent writers all land, and a database travels
between machines by export / import with measured records winning."""
from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import time

import pytest

from packager.optimize.schedule.measure import database
from packager.optimize.schedule.measure.database import TuningDatabase, stale
from packager.tools.tuning import Filter, export, import_records, prune, summary
from support.helpers import REPO, assert_clean_error, run_pack, write_spec


def _db(folder, records: dict[str, tuple[str, str, bool]]) -> TuningDatabase:
    """records: key -> (kind, target, measured)."""
    db = TuningDatabase(folder)
    for key, (kind, target, measured) in records.items():
        db.put(key, {"estimate_ms": 1.0, "measured": measured}, kind, target)
    db.save()
    return db


def test_a_record_of_other_rules_is_stale_and_not_replayed(tmp_path, monkeypatch):
    db = _db(tmp_path, {"k": ("gensor-cpu", "x86-64", True)})
    assert db.get("k", kind="gensor-cpu")["meta"]["rules"] == database.RULES["gensor-cpu"]
    assert db.get("k", kind="gensor-gpu") is None                  # another kind's key
    monkeypatch.setitem(database.RULES, "gensor-cpu", database.RULES["gensor-cpu"] + 1)
    assert stale(db.records["k"]) and TuningDatabase(tmp_path).get("k", kind="gensor-cpu") is None
    assert stale({"estimate_ms": 1.0})                             # no provenance: never replayed


def _writer(folder: str, tag: str, n: int) -> None:
    db = TuningDatabase(folder)
    for i in range(n):
        db.put(f"{tag}{i}", {"measured": True, "pad": "x" * 200}, "gensor-cpu", tag)
    db.save()


def test_concurrent_writers_all_land(tmp_path):
    """Four processes save into one database at once, twice each: every record is in the file."""
    ctx = multiprocessing.get_context("fork")
    for round_ in range(2):
        procs = [ctx.Process(target=_writer, args=(str(tmp_path), f"w{k}r{round_}-", 300)) for k in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert all(p.exitcode == 0 for p in procs)
    data = json.loads((tmp_path / "tuning.json").read_text())
    assert len(data["records"]) == 4 * 2 * 300
    assert not list(tmp_path.glob("*.tmp*"))                       # no half-written file left


def test_export_then_import_merges_measured_first(tmp_path, monkeypatch):
    a = _db(tmp_path / "a", {"k1": ("gensor-cpu", "x86-64/avx2", True), "k2": ("gensor-gpu", "cuda/sm_90/h100", False),
                             "k3": ("layout", "x86-64/avx2", False)})
    b = _db(tmp_path / "b", {"k1": ("gensor-cpu", "x86-64/avx2", False), "k3": ("layout", "x86-64/avx2", True)})
    assert export(a, tmp_path / "x86.json", Filter(target="x86-64")) == 2          # k1, k3
    assert export(a, tmp_path / "all.json", Filter()) == 3
    counts = import_records(b, tmp_path / "all.json")
    assert counts == {"added": 1, "replaced": 1, "kept": 1, "stale": 0}
    merged = TuningDatabase(tmp_path / "b").records
    assert merged["k1"]["measured"] and merged["k3"]["measured"]                 # measured won both ways
    assert set(merged) == {"k1", "k2", "k3"}
    monkeypatch.setitem(database.RULES, "gensor-gpu", database.RULES["gensor-gpu"] + 1)
    c = TuningDatabase(tmp_path / "c")
    assert import_records(c, tmp_path / "all.json")["stale"] == 1                # k2 is of older rules now


def test_the_newer_of_two_unmeasured_records_wins(tmp_path):
    old = _db(tmp_path / "old", {"k": ("gensor-gpu", "cuda/sm_80/a100", False)})
    time.sleep(1.1)
    new = _db(tmp_path / "new", {"k": ("gensor-gpu", "cuda/sm_80/a100", False)})
    export(new, tmp_path / "new.json", Filter())
    assert import_records(old, tmp_path / "new.json")["replaced"] == 1
    export(old, tmp_path / "back.json", Filter())
    assert import_records(new, tmp_path / "back.json")["kept"] == 1


def test_prune_removes_stale_records_and_with_all_what_matches(tmp_path, monkeypatch):
    db = _db(tmp_path, {"c1": ("gensor-cpu", "x86-64", True), "g1": ("gensor-gpu", "cuda/sm_90/h100", False),
                        "g2": ("gensor-gpu", "cuda/sm_80/a100", False)})
    monkeypatch.setitem(database.RULES, "gensor-cpu", database.RULES["gensor-cpu"] + 1)
    assert prune(db, Filter(), everything=False) == 1                            # c1 is stale
    assert prune(db, Filter(target="sm_90"), everything=True) == 1
    assert set(TuningDatabase(tmp_path).records) == {"g2"}
    assert prune(db, Filter(older_than_days=1), everything=True) == 0            # g2 is seconds old
    assert "1 record(s)" in summary(TuningDatabase(tmp_path), Filter())[0]


def test_pack_tuning_commands(tmp_path):
    _db(tmp_path / "db", {"k1": ("gensor-cpu", "x86-64", True), "k2": ("layout", "x86-64", False)})
    r = run_pack("tuning", "list", "--db", tmp_path / "db")
    assert r.returncode == 0 and "2 record(s)" in r.stdout and "gensor-cpu" in r.stdout, r.stdout + r.stderr
    r = run_pack("tuning", "export", tmp_path / "new" / "out.json", "--db", tmp_path / "db", "--kind", "layout")
    assert r.returncode == 0 and "exported 1 record(s)" in r.stdout, r.stderr
    r = run_pack("tuning", "import", tmp_path / "new" / "out.json", "--db", tmp_path / "other")
    assert r.returncode == 0 and "1 added" in r.stdout, r.stderr
    (tmp_path / "bad.json").write_text("{\"records\": []}")
    assert_clean_error(run_pack("tuning", "import", tmp_path / "bad.json", "--db", tmp_path / "other"), 2,
                       "bad.json", "pack tuning export")
    assert_clean_error(run_pack("tuning", "list", "--db", tmp_path / "db", "--kind", "nope"), 2, "unknown record kind")
    (tmp_path / "file").write_text("")
    assert_clean_error(run_pack("tuning", "export", tmp_path / "file" / "x.json", "--db", tmp_path / "db"), 2,
                       "cannot write")


@pytest.mark.slow
def test_two_builds_at_once_share_one_database(sample_root, tmp_path):
    """Two `pack build`s (measuring) write one database at the same time: both succeed and the
    database holds the records of both."""
    import yaml

    procs = []
    for name in ("mlp", "cnn"):
        spec = yaml.safe_load((REPO / "samples" / name / "spec.yaml").read_text())
        spec["targets"] = ["x86-64"]
        spec.setdefault("optimize", {}).setdefault("tuning", {})["database"] = str(tmp_path / "db")
        spec["model"] = str(sample_root / name / spec["model"])
        spec = write_spec(tmp_path / name, yaml.safe_dump(spec))
        procs.append(subprocess.Popen([sys.executable, "-m", "packager.cli", "build", str(spec), "--output",
                                       str(tmp_path / f"{name}-pkg")], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=1200)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    records = json.loads((tmp_path / "db" / "tuning.json").read_text())["records"]
    kinds = {r["meta"]["kind"] for r in records.values()}
    assert "gensor-cpu" in kinds and len(records) >= 4, kinds
    assert not any(stale(r) for r in records.values())
