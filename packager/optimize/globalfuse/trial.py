"""Trial schedules: a proposed fused kernel is only taken when the target's scheduler
(`KernelScheduler.rule`) still schedules it as well as the kernel it grows (the same rule, never
a fallback)."""
from __future__ import annotations

WEAK_RULES = {"naive", "fallback", "none"}


def keeps_schedule(before: str, after: str) -> bool:
    """A fusion may not cost the grown kernel its schedule."""
    return after not in WEAK_RULES and (after == before or before in WEAK_RULES)
