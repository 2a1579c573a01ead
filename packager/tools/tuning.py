"""`pack tuning {list,export,import,prune}`: look into a tuning database and share one.

A team keeps one database (exported from a build machine that measured, imported on the
others); a record says what produced it, for which target, with which rules version
(schedule/measure/database.py). Imports merge under the database's lock: a measured record is never
replaced by an unmeasured one, otherwise the newer wins; stale records (another rules version)
are not imported. Prune drops stale records, and with filters those of a target, kind or age.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..optimize.schedule.measure.database import RULES, VERSION, TuningDatabase, stale


@dataclass(frozen=True)
class Filter:
    target: str | None = None          # substring of the record's target (e.g. "sm_90", "x86-64")
    kind: str | None = None
    older_than_days: float | None = None

    def __post_init__(self):
        if self.kind is not None and self.kind not in RULES:
            raise UserError(f"unknown record kind '{self.kind}': one of {', '.join(RULES)}")

    def matches(self, record: dict) -> bool:
        meta = record.get("meta") or {}
        if self.target is not None and self.target not in str(meta.get("target", "")):
            return False
        if self.kind is not None and meta.get("kind") != self.kind:
            return False
        if self.older_than_days is not None and meta.get("time", 0) > time.time() - self.older_than_days * 86400:
            return False
        return True


def summary(db: TuningDatabase, which: Filter) -> list[str]:
    """One line per (kind, target): records, measured, stale, tuned (level 3)."""
    rows: Counter = Counter()
    for rec in db.records.values():
        if which.matches(rec):
            meta = rec.get("meta") or {}
            key = (meta.get("kind", "?"), meta.get("target", "?"))
            rows[key + ("records",)] += 1
            rows[key + ("measured",)] += bool(rec.get("measured"))
            rows[key + ("stale",)] += stale(rec)
            rows[key + ("tuned",)] += "tuned" in rec
    groups = sorted({k[:2] for k in rows})
    lines = [f"{db.path}: {sum(rows[g + ('records',)] for g in groups)} record(s)"]
    lines += [f"  {kind:14s} {target:40s} {rows[(kind, target, 'records')]:6d} records, "
              f"{rows[(kind, target, 'measured')]} measured, {rows[(kind, target, 'stale')]} stale"
              + (f", {rows[(kind, target, 'tuned')]} by the level-3 tuner" if rows[(kind, target, 'tuned')] else "")
              for kind, target in groups]
    return lines


def export(db: TuningDatabase, out: Path, which: Filter) -> int:
    """Write the matching current records to `out`; how many."""
    records = {k: r for k, r in db.records.items() if which.matches(r) and not stale(r)}
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"version": VERSION, "records": records}, indent=1, sort_keys=True) + "\n")
    except OSError as e:
        raise UserError(f"{out}: cannot write it ({e.strerror or e}); choose another file") from None
    return len(records)


def import_records(db: TuningDatabase, source: Path) -> dict[str, int]:
    """Merge `source` (a `pack tuning export` file) into the database: counts of added, replaced,
    kept (the database's record won) and stale (not imported)."""
    try:
        data = json.loads(source.read_text())
    except OSError as e:
        raise UserError(f"{source}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise UserError(f"{source}: not JSON ({e}); give a file written by `pack tuning export`") from None
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("records"), dict):
        raise UserError(f"{source}: not a tuning database of version {VERSION} (written by `pack tuning export` "
                        "of this packager)")
    incoming = data["records"]
    counts = Counter()

    def merge(records: dict) -> None:
        for key, rec in incoming.items():
            if not isinstance(rec, dict) or stale(rec):
                counts["stale"] += 1
            elif key not in records:
                records[key] = rec
                counts["added"] += 1
            elif _better(rec, records[key]):
                records[key] = rec
                counts["replaced"] += 1
            else:
                counts["kept"] += 1

    db.update(merge)
    return {k: counts[k] for k in ("added", "replaced", "kept", "stale")}


def prune(db: TuningDatabase, which: Filter, everything: bool) -> int:
    """Remove stale records (and with `everything`, all matching ones); how many."""
    removed = []

    def drop(records: dict) -> None:
        for key in [k for k, r in records.items() if which.matches(r) and (everything or stale(r))]:
            del records[key]
            removed.append(key)

    db.update(drop)
    return len(removed)


def _better(new: dict, old: dict) -> bool:
    """Measured beats estimated; between equals the newer wins."""
    if bool(new.get("measured")) != bool(old.get("measured")):
        return bool(new.get("measured"))
    return (new.get("meta") or {}).get("time", 0) > (old.get("meta") or {}).get("time", 0)
