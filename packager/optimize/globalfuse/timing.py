"""Timing a merged kernel against the kernels it replaces, where the target is timed (Souffle
refuses a fusion that does not pay). Each side is scheduled as the schedule pass will schedule it."""
from __future__ import annotations

from tvm import tirx

from ..schedule.contract import KernelScheduler, StructMemo
from ..schedule.measure.database import RULES

# The rules version of recorded decisions (taken / refused, with both times), also in their keys;
# its history is at RULES in schedule/measure/database.py.
DECISIONS_VERSION = RULES["global-fusion"]


# The timer's repeatability on the 2-core build machine: one kernel timed against a copy of itself
# (min of 3 alternating rounds) came out 0.82-1.16x, most within +-6%. Within that band the
# measurement cannot tell the two sides apart, and the model decides as Souffle's does: the merged
# kernel moves fewer bytes and is one plan step less, so it is taken.
TIMER_RESOLUTION = 0.05


def pays(fused_s: float, separate_s: float) -> bool:
    """A merged kernel is kept unless measured slower than its parts by more than the timer resolves."""
    return fused_s <= separate_s * (1 + TIMER_RESOLUTION)


def fusion_timer(ctx) -> "FusionTimer | None":
    """A timer when the target runs here and the spec lets builds measure, else None."""
    return FusionTimer(ctx.scheduler) if ctx.scheduler.measuring else None


class FusionTimer:
    """Times kernels where the target is timed (this machine or its RPC device) as the schedule
    pass will schedule them (Gensor's measured choice or the rules; scheduled once per kernel
    structure). Each decision is recorded in the tuning database, so a rebuild takes the same
    fusions (timings on a busy machine flip close calls)."""

    def __init__(self, scheduler: KernelScheduler):
        opt = scheduler.opt
        self.scheduler = scheduler
        self.db = scheduler.database()
        gensor = opt.scheduler == "gensor"
        self.gensor = scheduler.searcher(opt.top_k, True, opt.enabled("reuse"), self.db) if gensor else None
        self.target_key = f"global-fusion/v{DECISIONS_VERSION}/{opt.scheduler}/{scheduler.target_key()}"
        self.memo = StructMemo()

    def compare(self, fused: tirx.PrimFunc, parts: list[tuple[tirx.PrimFunc, float]],
                fusion: str = "") -> tuple[float | None, float | None]:
        """(seconds of the merged kernel, seconds of the parts together: each part's time x its
        weight, e.g. 1/readers for a copy the merged kernel shares with other readers), from the
        database when this merge was timed before."""
        key = self.scheduler.record_key(fused, self.target_key)
        rec = self.db.get(key, kind="global-fusion")
        if rec is not None:
            return rec["fused_s"], rec["separate_s"]
        times = self._time([fused, *(f for f, _ in parts)])
        fused_s, part_s = times[0], times[1:]
        separate = None if None in part_s else sum(t * w for t, (_, w) in zip(part_s, parts))
        if fused_s is not None and separate is not None:
            self.db.put(key, {"fused_s": fused_s, "separate_s": separate, "measured": True, "fusion": fusion},
                        "global-fusion", self.target_key)
        return fused_s, separate

    def verdict(self, fused: tirx.PrimFunc, parts: list[tuple[tirx.PrimFunc, float]],
                fusion: str = "") -> tuple[str, dict | None]:
        """("", {fused_us, separate_us}) when the merged kernel pays (timing.pays), else (why, None)."""
        fused_s, separate_s = self.compare(fused, parts, fusion)
        if fused_s is None or separate_s is None:
            return "could not be timed", None
        if not pays(fused_s, separate_s):
            return f"slower when measured: {fused_s * 1e6:.0f} vs {separate_s * 1e6:.0f} us", None
        return "", {"fused_us": round(fused_s * 1e6, 1), "separate_us": round(separate_s * 1e6, 1)}

    def _time(self, funcs: list[tirx.PrimFunc]) -> list[float | None]:
        """Each kernel scheduled as the schedule pass will schedule it, then all timed in
        alternation (a merged kernel and its parts see the same quiet and busy periods).

        Timed warm even for a model whose weights exceed the cache (schedule/measure/timing.py times its kernel
        candidates cold): a fusion changes where an intermediate goes, and in the package that
        activation was just written and is in cache; both sides read the same weights. The
        cold timing flushes every argument but the first, intermediates included, and refused
        BERT-base's softmax row regions (103 vs 92 us) that were taken before."""
        return self.scheduler.time([self.memo.get(f, self._schedule) for f in funcs], warm=True)

    def _schedule(self, func: tirx.PrimFunc) -> tirx.PrimFunc:
        return self.gensor.schedule(func)[0] if self.gensor else self.scheduler.scheduled(func).func

    def save(self) -> None:
        self.db.save()
