"""The tuning database: one JSON record per (kernel workload, target), so a rebuild reuses what
an earlier build chose (and measured) instead of walking and timing again. A build with a given
database is deterministic: the walk is seeded from the workload key, and a recorded choice wins.

File: <folder>/tuning.json, {"version": 1, "records": {key: record}}; written atomically under
a lock, so parallel builds never leave a half-written file. A later issue (ETO reuse) reads the
same records to transfer schedules across similar operators.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ...cache import cache_dir, filling, locked

VERSION = 1


class TuningDatabase:
    def __init__(self, folder: Path | None = None):
        self.folder = Path(folder) if folder else cache_dir() / "tuning"
        self.path = self.folder / "tuning.json"
        self.records: dict[str, dict] = self._read()
        self.new: dict[str, dict] = {}

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data.get("records", {}) if data.get("version") == VERSION else {}

    def get(self, key: str, measured_only: bool = False) -> dict | None:
        rec = self.new.get(key) or self.records.get(key)
        if rec is None or (measured_only and not rec.get("measured")):
            return None
        return rec

    def put(self, key: str, record: dict) -> None:
        self.new[key] = record

    def save(self) -> None:
        """Merge this build's records into the file (other builds may have added theirs)."""
        if not self.new:
            return
        with filling(folder=self.folder):
            self.folder.mkdir(parents=True, exist_ok=True)
        with locked(self.folder / ".lock"):
            records = self._read()
            records.update(self.new)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            with filling(tmp, folder=self.folder):
                tmp.write_text(json.dumps({"version": VERSION, "records": records}, indent=1, sort_keys=True))
                os.replace(tmp, self.path)
        self.records, self.new = records, {}
