"""What the layout search charges a candidate for converting a tensor between channel blocks
(ALT Constraint 3): timed where the target is timed, else estimated from where the tensor lives.

The conversion reads a tensor its producer has just written. A tensor that fits in the last-level
cache is read from there, not from DRAM: charging every conversion at DRAM speed put the charge
2.6-4.8x above the timed conversions (docs/layouts.md), and kept convs behind NCHW producers in
NCHW where the blocked conv plus its conversion was faster. Timed, the conversion is TOPI's
layout_transform scheduled by the target's rules (the kernel the build makes of it), its input
just written, once per shape and block pair (the database keeps it).
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx, topi

from ..schedule.contract import KernelScheduler
from ..schedule.hardware import llc_bytes_per_second, resident_in_llc
from .primitives import layout_name


def conversion_func(shape: tuple[int, ...], dtype: str, src: int, dst: int) -> tirx.PrimFunc:
    """NCHW{src}c -> NCHW{dst}c (block 1: plain NCHW) of an NCHW tensor of `shape`."""
    n, c, h, w = shape
    stored = (n, c, h, w) if src == 1 else (n, c // src, h, w, src)
    x = te.placeholder(stored, dtype, name="x")
    y = topi.layout_transform(x, layout_name("NCHW", src), layout_name("NCHW", dst))
    return te.create_prim_func([x, y])


class ConversionCost:
    """ms of converting an NCHW tensor between channel blocks, per (shape, dtype, src, dst)."""

    def __init__(self, scheduler: KernelScheduler, db, target_key: str, measuring: bool):
        self.scheduler = scheduler
        self.db = db
        self.target_key = target_key
        self.measuring = measuring
        hw = scheduler.hardware()
        self.llc_bps = llc_bytes_per_second(hw, scheduler.target)
        self.dram_bps = hw.bytes_per_second("DRAM")
        self.counts = {"timed": 0, "from_database": 0, "estimated": 0}

    def ms(self, shape: tuple[int, ...], dtype: str, src: int, dst: int) -> float:
        """The conversion's time: measured (kept in the database) where the target is timed, else estimated."""
        if src == dst:
            return 0.0
        if not self.measuring:
            return self._estimated(shape, dtype)
        key = f"layout/{self.target_key}/conversion/{'x'.join(map(str, shape))}/{dtype}/{src}->{dst}"
        rec = self.db.get(key, measured_only=True, kind="layout")
        if rec is not None:
            self.counts["from_database"] += 1
            return rec["ms"]
        ms = self._time(shape, dtype, src, dst)
        if ms is None:
            return self._estimated(shape, dtype)
        self.counts["timed"] += 1
        self.db.put(key, {"ms": round(ms, 5), "measured": True}, "layout", self.target_key)
        return ms

    def note(self) -> str:
        """The build report's words on how conversions were charged."""
        c = self.counts
        if self.measuring:
            return (f"conversions between channel blocks charged as timed ({c['timed']} timed now, "
                    f"{c['from_database']} times from the database, {c['estimated']} estimated)")
        return "conversions between channel blocks charged from the cache level the tensor lives in (estimated)"

    def _estimated(self, shape: tuple[int, ...], dtype: str) -> float:
        self.counts["estimated"] += 1
        return self.estimate_ms(shape, dtype)

    def estimate_ms(self, shape: tuple[int, ...], dtype: str) -> float:
        """Read + write of the tensor, from the last-level cache where both fit there, else from DRAM."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        bps = self.llc_bps if resident_in_llc(self.scheduler.target, 2 * nbytes) else self.dram_bps
        return 2 * nbytes / bps * 1e3

    def _time(self, shape: tuple[int, ...], dtype: str, src: int, dst: int) -> float | None:
        trial = self.scheduler.scheduled(conversion_func(shape, dtype, src, dst))
        if trial.func is None:
            return None
        seconds = self.scheduler.time([trial.func], written_first=True)[0]
        return seconds * 1e3 if seconds is not None and np.isfinite(seconds) else None
