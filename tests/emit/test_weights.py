"""weights.bin: aligned placement and deduplication of identical constants."""
from __future__ import annotations

import numpy as np

from packager.emit.weights import WeightStore


def test_alignment_dedup_and_contents(tmp_path):
    ws = WeightStore()
    a = np.arange(5, dtype=np.float32)
    b = np.ones((3, 3), np.int64)
    oa, ob, oa2 = ws.add(a), ws.add(b), ws.add(a.copy())
    assert oa == oa2 == 0 and ob == 64
    assert ws.add(a.astype(np.float64)) != oa           # same values, other dtype: another blob
    size = ws.write(tmp_path / "w.bin")
    raw = (tmp_path / "w.bin").read_bytes()
    assert len(raw) == size
    assert np.frombuffer(raw[oa:oa + 20], np.float32).tolist() == a.tolist()
    assert np.frombuffer(raw[ob:ob + 72], np.int64).tolist() == [1] * 9
