"""The tuning database: one JSON record per (kernel workload, target), so a rebuild reuses what
an earlier build chose (and measured) instead of walking and timing again. A build with a given
database is deterministic: the walk is seeded from the workload, and a recorded choice wins.

File: <folder>/tuning.json, {"version": 2, "records": {key: record}}, one record per line (a
diff shows the records that changed; writing it costs a quarter of an indented dump). Every record carries
`meta`: what produced it (kind), the version of that producer's rules, the target it is for,
when, and which packager. A record whose kind has another rules version than this packager's is
stale: never replayed (a packager whose rules would decide differently bumps its kind's version
in RULES), and `pack tuning prune` removes it. Writes merge under a lock and replace the file
atomically, so concurrent builds sharing one database each add their records and never leave a
half-written file. `pack tuning {list,export,import,prune}` (tools/tuning.py) shares one database
across a team. A file is parsed once per process and version (its stat): a build opens the
database from several passes, and a 10 MB file took 0.2 s per parse.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

from ....cache import cache_dir, filling, locked

VERSION = 2
# The rules version of each record kind: bump one when its decisions change for the same workload.
RULES = {
    "gensor-cpu": 9,        # CPU tile plans (schedule/gensor.py); 2: level 2 without ETO reuse by default (a
                            # reused program alone was often kept), plans carry the chunk loop order;
                            # 3: timed on all cores (TVM's pool had used half: one thread on 2 cores);
                            # 4: a KxK conv's input-channel loop innermost (rules_cpu.py), so the rules
                            # baseline every plan is timed against changed; 5: every run timed with
                            # its activation just rewritten on all cores (measure.py); 6: depthwise convs
                            # and pooling also timed with their padding per task (padding.py); 7: a
                            # staged padding's (and every element-wise kernel's) short rows vectorized
                            # without straddling an outer axis (rules/cpu.py _flat_parallel_vector); 8: a
                            # plan with one reduction chunk keeps its accumulators in registers, window
                            # kernels also time register-blocked rows (gensor/window.py); 9: depthwise
                            # convs and pooling over NCHW{c} also read their padding inline (padding.py)
    "gensor-gpu": 2,        # GPU tile plans (schedule/gensor_gpu.py); 2: walk seeded by kernel structure
    "layout": 11,           # ALT layout and panel decisions (layout/search.py); 2: candidates scored from
                            # scratch (reused programs decided between layouts); 3: timed on all cores;
                            # 4: KxK convs scheduled with their input channels innermost; 5: plans
                            # timed with the activation just rewritten; 6: a conv read by one conv chooses
                            # its output block with that conv's cost; depthwise plans pad per task;
                            # 7: short rows of copies and staged pads vectorized within an outer index;
                            # 8: one-chunk plans with register accumulators, window plans (gensor/window.py);
                            # 9: close candidates timed again together (run-off), ties to a preferred layout;
                            # 10: conversions charged as timed (or from the last-level cache), not at DRAM speed;
                            # 11: depthwise convs and pooling over NCHW{c} read their padding inline
    "global-fusion": 12,    # merged kernel vs its parts, measured (globalfuse/timing.py): 2 = row regions
                            # with a predicated last row tile; 3 = reduction loops split at a folded
                            # reshape's period, merged kernel and parts timed in alternation; 4 = transposed
                            # copies tiled, a matmul staged in a row region register-tiled, timed on
                            # all cores; 5 = softmax / layer norm parts summed in vector partial sums;
                            # 6 = reduction epilogues, timed warm for every model; 7 = KxK convs with
                            # their input channels innermost; 8 = pooling / depthwise pad per task;
                            # 9 = element-wise parts' short rows vectorized within an outer index;
                            # 10 = one-chunk plans with register accumulators, window plans;
                            # 11 = element-wise parts' awkward planes: whole vectors and a scalar tail;
                            # 12 = depthwise / pooling parts read their padding inline
    "winograd-cpu": 5,      # direct conv vs Winograd F(4x4) / F(2x2), measured per conv shape (optimize/winograd);
                            # 2: kernels timed as built (activation written, weights flushed), a 0.9 margin;
                            # 3: each tile's kernels timed as a chain, only the weights flushed (measure/chain.py);
                            # 4: the direct conv's staged padding vectorized within an outer index;
                            # 5: the direct conv's one-chunk plans keep their accumulators in registers
    "derive": 5,            # derive's measured decision per operator shape (derive/graph.py); 2: timed on
                            # all cores; 3: the conv it is timed against has its input channels innermost;
                            # 4: that conv's staged padding vectorized within an outer index; 5: its
                            # one-chunk plans keep their accumulators in registers
}


class TuningDatabase:
    def __init__(self, folder: Path | None = None):
        self.folder = Path(folder) if folder else default_folder()
        self.path = self.folder / "tuning.json"
        self.records: dict[str, dict] = self._read()
        self.new: dict[str, dict] = {}

    def _read(self) -> dict[str, dict]:
        """The file's records, shared read-only between the instances of this process until the
        file changes (update() copies before changing them)."""
        try:
            stat = self.path.stat()
        except OSError:
            return {}
        version = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        cached = _PARSED.get(self.path)
        if cached is not None and cached[0] == version:
            return cached[1]
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        records = data.get("records", {}) if data.get("version") == VERSION else {}
        _PARSED[self.path] = (version, records)
        return records

    def get(self, key: str, measured_only: bool = False, kind: str | None = None) -> dict | None:
        """The record under `key`, unless it is stale for `kind` (or, with measured_only, not measured)."""
        rec = self.new.get(key) or self.records.get(key)
        if rec is None or (measured_only and not rec.get("measured")):
            return None
        if kind is not None and stale(rec, kind):
            return None
        return rec

    def put(self, key: str, record: dict, kind: str, target: str) -> None:
        from .... import __version__

        meta = {"kind": kind, "rules": RULES[kind], "target": target, "time": round(time.time()),
                "packager": __version__}
        self.new[key] = {**record, "meta": meta}

    def save(self) -> None:
        """Merge this build's records into the file (other builds may have added theirs)."""
        if self.new:
            new = self.new
            self.update(lambda records: records.update(new))

    def update(self, change: Callable[[dict[str, dict]], object]) -> dict[str, dict]:
        """Apply `change` to the file's records under the lock and write them back atomically;
        the records as written."""
        with filling(folder=self.folder):
            self.folder.mkdir(parents=True, exist_ok=True)
        with locked(self.folder / ".lock"):
            records = dict(self._read())
            change(records)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            with filling(tmp, folder=self.folder):
                tmp.write_text(_dump(records))
                os.replace(tmp, self.path)
            stat = self.path.stat()
            _PARSED[self.path] = ((stat.st_mtime_ns, stat.st_size, stat.st_ino), records)
        self.records, self.new = records, {}
        return records


_PARSED: dict[Path, tuple[tuple[int, int, int], dict[str, dict]]] = {}   # path -> (stat, records)


def _dump(records: dict[str, dict]) -> str:
    """The file's text: valid JSON with one record per line, keys sorted."""
    lines = ",\n".join(f"{json.dumps(k)}: {json.dumps(records[k], separators=(',', ':'), sort_keys=True)}"
                       for k in sorted(records))
    return f'{{"version": {VERSION}, "records": {{\n{lines}\n}}}}\n'


def default_folder() -> Path:
    return cache_dir() / "tuning"


def stale(record: dict, kind: str | None = None) -> bool:
    """A record of another rules version than this packager's (or of no known kind)."""
    meta = record.get("meta") or {}
    if meta.get("kind") not in RULES or (kind is not None and meta["kind"] != kind):
        return True
    return RULES[meta["kind"]] != meta.get("rules")
