"""One shape profile's layout choices replayed for the model's next profiles (search.py decides
them once): the graphs differ only in batch or sequence sizes, and one set of layouts means the
weights are packed once (profiles share weights.bin)."""
from __future__ import annotations

from .matmul import MatmulSite
from .search import Decision, MatmulDecision
from .sites import ConvSite, NextConv, PadContext, PoolSite


class ProfileMemo:
    """Keeps one shape profile's choices for the next profiles of the same model: the graphs
    differ only in batch/sequence sizes, and one set of layouts means the weights are packed once
    (profiles share weights.bin). Replays by position; a conv whose channels or kernel differ
    (not the same graph) is decided afresh."""

    def __init__(self):
        self.convs: list[tuple[ConvSite, Decision]] = []
        self.matmuls: list[tuple[MatmulSite, MatmulDecision]] = []

    def wrap(self, search) -> "_Replaying":
        return _Replaying(search, self)


class _Replaying:
    def __init__(self, search, memo: ProfileMemo):
        self.search, self.memo = search, memo
        self.n_conv = self.n_mm = 0

    @property
    def measuring(self) -> bool:
        return self.search.measuring

    @property
    def conversions(self):
        return self.search.conversions

    def decide(self, site: ConvSite, incoming: int, allowed_out=None, next_conv: NextConv | None = None,
               pool: PoolSite | None = None, padding: PadContext | None = None) -> Decision:
        i, self.n_conv = self.n_conv, self.n_conv + 1
        if i < len(self.memo.convs):
            old, d = self.memo.convs[i]
            if old.weight == site.weight and old.data[1] == site.data[1] and old.groups == site.groups:
                return d
        d = self.search.decide(site, incoming, allowed_out, next_conv, pool, padding)
        if i >= len(self.memo.convs):
            self.memo.convs.append((site, d))
        return d

    def decide_matmul(self, site: MatmulSite) -> MatmulDecision:
        i, self.n_mm = self.n_mm, self.n_mm + 1
        if i < len(self.memo.matmuls):
            old, d = self.memo.matmuls[i]
            if (old.k, old.n) == (site.k, site.n):
                return d
        d = self.search.decide_matmul(site)
        if i >= len(self.memo.matmuls):
            self.memo.matmuls.append((site, d))
        return d

    def save(self) -> None:
        self.search.save()
