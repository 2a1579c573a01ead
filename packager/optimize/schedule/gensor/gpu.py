"""Gensor on CUDA targets: construction only (analytical; no GPU is assumed at build time). The
GPU schedule pass (rules/gpu.py) tries it first for kernels with one reduction anchor."""
from __future__ import annotations

from dataclasses import replace

import tvm_ffi
from tvm import s_tir, tirx

from ....targets import Target
from ..measure.database import TuningDatabase
from .cpu import RESTARTS, Choice, seed_of
from .gpu_lower import lower_gpu
from .gpu_model import GpuSpace
from ..hardware import gpu_hardware
from ..tir_util import is_reduction
from .walk import construct
from .workload import analyze, func_key

GPU_TRIES = 8                 # ranked plans tried before a kernel falls back to dlight


def gpu_target_key(target: Target) -> str:
    """Records are per GPU architecture and target name (nothing is timed: no machine in the key)."""
    return f"cuda/{target.sm}/{target.name}"


class GensorGpu:
    """Construction for CUDA targets: analytical only (no GPU is assumed at build time); the
    best-ranked plan that the CUDA template accepts wins. The walk is seeded by the kernel's
    structure, not its text: kernels equal up to names (a phase of a merged chain and the kernel
    it was) get the same plan."""

    def __init__(self, target: Target, db: TuningDatabase):
        self.target, self.db = target, db
        self.hw = gpu_hardware(target)
        self.target_key = gpu_target_key(target)

    def schedule(self, func: tirx.PrimFunc, threads: int | None = None) -> tuple[tirx.PrimFunc, Choice] | None:
        """The scheduled kernel and its choice, or None (no single reduction anchor, or no plan
        fits the template): the caller uses dlight's rules. With `threads`, the best plan with
        that many threads per block (a phase of a cooperative kernel takes its blocks' shape)."""
        sch = s_tir.Schedule(func)
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
        anchors = [b for b in blocks if is_reduction(sch, b)]
        if len(anchors) != 1:
            return None
        try:
            wl = analyze(sch, anchors[0], "")
        except Exception:  # noqa: BLE001 - symbolic/empty extents, unusual regions: dlight takes it
            return None
        base = func_key(func, self.target_key)
        key = f"{base}/threads{threads}" if threads else base
        rec = self.db.get(key, kind="gensor-gpu")
        if rec is not None and rec.get("plan"):
            choice = Choice.from_record(rec)
            try:
                return lower_gpu(func, choice.plan, self.target), choice
            except Exception:  # noqa: BLE001 - stale record: construct again
                pass
        space = GpuSpace(replace(wl, key=base), self.hw)
        try:
            ranked = construct(space, seed_of(str(tvm_ffi.structural_hash(func))), restarts=RESTARTS)
        except Exception:  # noqa: BLE001 - degenerate iteration space (e.g. a 0-d output): dlight takes it
            return None
        if threads:
            ranked = [(est, st) for est, st in ranked if space.to_plan(st).gpu_threads() == threads]
        for est, st in ranked[:GPU_TRIES]:
            plan = space.to_plan(st)
            try:
                out = lower_gpu(func, plan, self.target)
            except Exception:  # noqa: BLE001 - the template refuses this plan: next one
                continue
            choice = Choice("gensor", plan, est * 1e3, candidates=len(ranked))
            self.db.put(key, choice.record(), "gensor-gpu", self.target_key)
            return out, choice
        return None
