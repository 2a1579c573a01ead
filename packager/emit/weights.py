"""weights.bin: every constant the kernels read, 64-byte aligned, in the layout they read it.

Identical constants (same dtype, shape and bytes, e.g. shared across shape profiles) are
stored once.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from .memory import align


class WeightStore:
    def __init__(self) -> None:
        self.blobs: list[bytes] = []
        self.offsets: list[int] = []
        self.size = 0
        self._index: dict[tuple, int] = {}

    def add(self, value: np.ndarray) -> int:
        """Store `value` (C order) and return its byte offset in weights.bin."""
        data = np.ascontiguousarray(value).tobytes()
        key = (str(value.dtype), tuple(value.shape), hashlib.sha256(data).digest())
        if key in self._index:
            return self._index[key]
        offset = align(self.size)
        self.blobs.append(data)
        self.offsets.append(offset)
        self.size = offset + len(data)
        self._index[key] = offset
        return offset

    def write(self, path: Path) -> int:
        """Write weights.bin; returns its size in bytes."""
        with open(path, "wb") as fh:
            pos = 0
            for off, data in zip(self.offsets, self.blobs):
                fh.write(b"\0" * (off - pos))
                fh.write(data)
                pos = off + len(data)
        return self.size
