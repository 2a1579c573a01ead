"""Static memory planning: tensors alive at the same time never overlap; memory is reused."""
from __future__ import annotations

import numpy as np

from packager.emit.memory import ALIGN, Lifetime, plan_offsets


def _check(items, offsets, total):
    for i, a in enumerate(items):
        assert offsets[i] % ALIGN == 0
        assert offsets[i] + a.size <= total
        for j in range(i):
            b = items[j]
            alive_together = not (a.last < b.first or b.last < a.first)
            disjoint = offsets[i] + a.size <= offsets[j] or offsets[j] + b.size <= offsets[i]
            assert not alive_together or disjoint or a.size == 0 or b.size == 0, (a, b, offsets[i], offsets[j])


def test_chain_reuses_memory():
    # x -> a -> b -> c -> y: only neighbours are alive together
    items = [Lifetime(-1, 0, 1000), Lifetime(0, 1, 1000), Lifetime(1, 2, 1000), Lifetime(2, 3, 1000),
             Lifetime(3, 4, 1000)]
    offsets, total = plan_offsets(items)
    _check(items, offsets, total)
    assert total == 2 * 1024                      # two 64-aligned slots suffice


def test_inputs_and_outputs_of_one_step_never_share():
    items = [Lifetime(0, 0, 64), Lifetime(0, 0, 64)]
    offsets, _ = plan_offsets(items)
    assert offsets[0] != offsets[1]


def test_random_lifetimes_never_overlap():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        items = []
        for _ in range(n):
            a = int(rng.integers(-1, 20))
            items.append(Lifetime(a, a + int(rng.integers(0, 6)), int(rng.integers(0, 5000))))
        offsets, total = plan_offsets(items)
        _check(items, offsets, total)
        assert total <= sum((it.size + ALIGN - 1) // ALIGN * ALIGN for it in items)


def test_empty():
    assert plan_offsets([]) == ([], 0)
