"""Static memory planning: one arena per model instance, offsets assigned from liveness.

Greedy by size (as TFLite's planner): the largest tensors are placed first, each at the lowest
64-byte aligned offset that no tensor alive at the same time occupies. A tensor is alive from the
step that writes it to the last step that reads it, both included, so a kernel's inputs and
outputs never share memory (TVM kernels are not written for in-place operation).
"""
from __future__ import annotations

from dataclasses import dataclass

ALIGN = 64


@dataclass(frozen=True)
class Lifetime:
    first: int     # first step that needs the tensor (-1: before the first step, e.g. inputs)
    last: int      # last step that needs it
    size: int      # bytes


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def plan_offsets(items: list[Lifetime]) -> tuple[list[int], int]:
    """Offsets for every item (same order) and the arena size they need."""
    order = sorted(range(len(items)), key=lambda i: (-items[i].size, items[i].first, i))
    placed: list[tuple[int, int, Lifetime]] = []          # (offset, aligned size, lifetime)
    offsets = [0] * len(items)
    for i in order:
        it = items[i]
        need = align(it.size)
        busy = sorted((off, size) for off, size, other in placed
                      if not (other.last < it.first or it.last < other.first))
        offset = 0
        for off, size in busy:
            if offset + need <= off:
                break
            offset = max(offset, off + size)
        offsets[i] = offset
        placed.append((offset, need, it))
    total = max((off + size for off, size, _ in placed), default=0)
    return offsets, total
