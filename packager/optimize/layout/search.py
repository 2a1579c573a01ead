"""Joint layout + loop search for convolutions (ALT §5, with Gensor as the loop tuner).

For each conv, in topological order, the layout candidates of ALT's C2D template restricted to
channel blocking are scored together with their loops: the conv is written over the candidate's
layouts (conv.py), Gensor constructs its tile plans for that loop nest, and the score is the best
plan's time, measured where the target is timed (else Gensor's estimate). A candidate whose input
layout differs from what the producer writes pays for one conversion (ALT Constraint 3).

Two steps of ALT's joint search along a chain, where greedy choices were measured wrong
(docs/layouts.md has the numbers): a conv whose output only a memory-bound conv reads (a
depthwise conv, a 1x1 conv from few channels) scores each output block with that conv's best
candidate given the block (only blocks within LOOKAHEAD_WITHIN of the best alone); a conv whose
output only a pooling reads scores the pooling's time in each block (PoolSite).

Candidates per conv: output block in {1 (NCHW), v, 2v} (v = fp32 vector lanes), input block = the
producer's block, or v when the producer writes NCHW; where v lanes do not divide the channels
and half a vector does (72, 24, 40 channels on AVX-512), v/2 too (half_block). A conv whose
output channels are not whole blocks also scores its blocked candidates with the channels
padded (pad.py), and computes the padding where that beats its best unpadded candidate by
PAD_GAIN, a conversion back to NCHW included. A conv is scored with a transcendental epilogue
(SiLU, GELU, ...) when one follows, as its kernel will compute it. Unfold (overlapped spatial tiles) and spatial layout tiling are
not searched here.

Each candidate is timed when it is scored, at a different moment from the others: on a host
whose neighbours slow it for seconds at a time one of two close candidates can time 1.9x slow
(ViT-tiny's MLP matmul, docs/corpus.md). So the candidates within RUNOFF_WITHIN of the best are
timed again together, in one interleaved call with their inputs just written (a run-off), and
those results decide; among run-off times within TIE of the best (both with a floor in
microseconds for kernels of a few), the layout that keeps the producer's block and writes
vector-wide blocks wins, so near-equal candidates are settled the same way in every build.

Decisions are shared within a shape class (ConvSite.class_key: the same conv but for its input
channels, rounded up to a power of two, in the same context): the first conv of a class is
scored, the others take its layouts (the report names the conv they came from).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
from tvm import tirx

from ..schedule.contract import KernelScheduler
from .conversion import ConversionCost
from .matmul import MatmulSite
from .primitives import layout_name
from .sites import ConvSite, NextConv, PadContext, PoolSite

SEARCH_TOP_K = 2              # tile plans measured per layout candidate
LOOKAHEAD_WITHIN = 1.5        # output blocks scored with the next conv: own score within 1.5x of the best
RUNOFF_WITHIN = 1.3           # candidates within 1.3x (+ 5 us) of the best are timed again, together
RUNOFF_FLOOR_MS = 0.005       # (kernels of a few us time up to 2x apart from one build to the next)
TIE = 1.03                    # run-off results within 3% (+ 1 us: thread wake-up jitter) of the best:
TIE_FLOOR_MS = 0.001          # the preferred layout wins
HALF_BLOCK_MIN = 8            # half-vector blocks: offered where they are at least 8 lanes (AVX-512)
PAD_GAIN = 0.9                # padded output channels: chosen when at most 0.9x the best unpadded score
                              # (at most 1 / 0.9x where the padding flows on into every reader)


@dataclass
class Decision:
    """The layouts chosen for one conv, with every candidate's score (ms), and per output block of
    this one: the next conv's best score when it was looked ahead to (`ahead`), the pooling's time
    when a pooling alone reads the output (`pool`)."""

    data_block: int
    out_block: int
    w_in: int
    w_out: int
    scores: dict[str, float] = field(default_factory=dict)
    measured: bool = False
    reused: bool = False
    ahead: dict[str, float] = field(default_factory=dict)
    pool: dict[str, float] = field(default_factory=dict)
    shared_from: str = ""              # the conv of the same shape class whose scores decided (its key)
    padded_from: int = 0               # output channels when the conv computes them padded (pad.py)
    runoff: dict[str, float] = field(default_factory=dict)   # first timings of the candidates timed again

    @property
    def changed_by_runoff(self) -> bool:
        """The run-off chose another candidate than the first timings of the same candidates."""
        return _changed(self.runoff, self.scores)

    @property
    def changed_by_lookahead(self) -> bool:
        """The output block differs from the one this conv's own scores alone would choose."""
        return bool(self.ahead or self.pool) and self._alone_block() != self.out_block

    def _alone_block(self) -> int:
        return int(_out(min(self.scores, key=self.scores.get)))

    def layouts(self) -> tuple[str, str, str]:
        kernel = "OIHW" if (self.w_in, self.w_out) == (1, 1) else f"OIHW{self.w_in}i{self.w_out}o"
        return layout_name("NCHW", self.data_block), kernel, layout_name("NCHW", self.out_block)

    def record(self) -> dict:
        return {"data_block": self.data_block, "out_block": self.out_block, "w_in": self.w_in, "w_out": self.w_out,
                "scores": self.scores, "measured": self.measured, "ahead": self.ahead, "pool": self.pool,
                **({"runoff": self.runoff} if self.runoff else {}),
                **({"shared_from": self.shared_from} if self.shared_from else {})}

    @staticmethod
    def from_record(r: dict) -> "Decision":
        return Decision(r["data_block"], r["out_block"], r["w_in"], r["w_out"], r.get("scores", {}),
                        r.get("measured", False), reused=True, ahead=r.get("ahead", {}), pool=r.get("pool", {}),
                        shared_from=r.get("shared_from", ""), runoff=r.get("runoff", {}))


def _changed(first: dict[str, float], scores: dict[str, float]) -> bool:
    """Whether the run-off's times rank another of `first`'s candidates fastest."""
    return bool(first) and min(first, key=first.get) != min(first, key=lambda k: scores[k])


def _preferred(candidate: str, incoming: int, lanes: int) -> tuple[bool, bool, bool]:
    """Sort key among tied candidates: keep the producer's block (no conversion), then write
    vector-wide blocks (what most readers take), and NCHW last."""
    data, out = (int(x) for x in candidate.split("/"))
    return data != incoming, out != lanes, out == 1


def _site_name(site: ConvSite) -> str:
    return f"{'x'.join(map(str, site.data))}*{'x'.join(map(str, site.weight))}"


def _out(candidate: str) -> str:
    """The output block of a "data/out" candidate key."""
    return candidate.split("/")[1]


def half_block(lanes: int, *channels: int) -> tuple[int, ...]:
    """(v/2,) where v lanes do not divide every one of `channels` and half a vector divides them
    all, at least HALF_BLOCK_MIN lanes wide; else (). Such tensors otherwise run NCHW, 1.4-5x
    slower for depthwise and 1x1 convs on AVX-512; quarter vectors lost on 1x1 convs
    (docs/layouts.md)."""
    half = lanes // 2
    fits = half >= HALF_BLOCK_MIN and any(c % lanes for c in channels) and all(c % half == 0 for c in channels)
    return (half,) if fits else ()


def vector_blocks(lanes: int, *channels: int, half: bool = True) -> tuple[int, ...]:
    """The packed blocks offered to tensors of these channels: v and 2v lanes, and (with `half`:
    optimize.passes.half_blocks) half a vector where it alone fits them (half_block)."""
    return (lanes, 2 * lanes, *(half_block(lanes, *channels) if half else ()))


def candidates(site: ConvSite, incoming: int, lanes: int, allowed_out: tuple[int, ...] | None = None,
               half: bool = True) -> list[tuple[int, int]]:
    """(data block, output block) pairs to score: the producer's layout as input (and, after a
    plain NCHW producer, one converted to v lanes, or half a vector where v does not divide the
    channels) x output blocks 1, v, 2v (+ v/2 likewise, + the producer's block: GhostNet's
    48-channel concat of two 24-channel halves in NCHW8c, read by a depthwise 3x3/2 that could
    only write NCHW or 16c, took 0.22 ms, 5x onnxruntime's node; or `allowed_out`, when the output
    meets another packed tensor downstream). Where the output can only be NCHW
    (a concat of channels that are not whole blocks, a graph output) after a blocked producer,
    also NCHW in behind a conversion: ShuffleNetV2's 1x1 24->58 @28x28 read its NCHW32c input
    across blocks (W-vectors gathered at stride 32) in 0.126 ms, 0.028 + 0.015 converted first.
    If none is valid, plain NCHW behind a conversion."""
    ins = [incoming] + ([lanes, *(half_block(lanes, site.channels) if half else ())] if incoming == 1 else [])
    own = [incoming] if incoming > 1 else []
    outs = allowed_out or (1, *vector_blocks(lanes, site.out_channels, half=half), *own)
    pairs = [(i, o) for i in ins for o in outs if site.valid(i, o)]
    if incoming > 1 and pairs and all(o == 1 for _, o in pairs):
        pairs.append((1, 1))          # NCHW out from a blocked input reads across its blocks: convert it first
    return list(dict.fromkeys(pairs)) or [(1, 1)]


class LayoutSearch:
    """Scores layout candidates with Gensor (same database, same hardware model)."""

    def __init__(self, scheduler: KernelScheduler, pad: bool = True, half: bool = True):
        self.pad, self.half = pad, half
        self.scheduler = scheduler
        self.db = scheduler.database()
        # No ETO reuse here: candidates are compared with each other, and a reused program's
        # quality (not the layout's) decided between them; from scratch costs the same 3 programs.
        self.gensor = scheduler.searcher(SEARCH_TOP_K, scheduler.opt.measure, db=self.db)
        self.lanes = scheduler.target.vector_lanes_f32
        self.conversions = ConversionCost(scheduler, self.db, self.gensor.target_key, self.measuring)

    @property
    def measuring(self) -> bool:
        return self.gensor.measure

    def _score(self, site: ConvSite, data_block: int, out_block: int) -> float:
        name = f"layout conv {_site_name(site)} {data_block}/{out_block}"
        return self._score_func(site.kernel(data_block, out_block), name)

    def _score_func(self, func, name: str = "") -> float:
        """The best schedule's time (ms): measured where the target is timed when possible, else estimated."""
        _, _, choice = self.gensor.schedule(func, name)
        if choice is None:
            return float("inf")
        times = [t for t in (choice.measured_ms, choice.rules_ms) if t is not None]
        return min(times) if times else (choice.estimate_ms if choice.estimate_ms is not None else float("inf"))

    def _scores(self, site: ConvSite, incoming: int, pairs: list[tuple[int, int]]) -> dict[str, float]:
        """Each (data block, output block) candidate's time, a conversion from `incoming` included."""
        scores = {}
        for data_block, out_block in pairs:
            ms = self._score(site, data_block, out_block) + self._conversion_ms(site, incoming, data_block)
            scores[f"{data_block}/{out_block}"] = round(ms, 4)
        return scores

    def _conversion_ms(self, site: ConvSite, src: int, dst: int) -> float:
        """What converting the conv's input from block `src` to `dst` costs (conversion.py)."""
        return self.conversions.ms(site.data, site.dtype, src, dst)

    def _runoff(self, scores: dict[str, float], kernel: Callable[[str], tirx.PrimFunc], name: str,
                extra: dict[str, float] | None = None) -> tuple[dict[str, float], dict[str, float]]:
        """(scores, first timings of the candidates timed again): the candidates within
        RUNOFF_WITHIN (+ RUNOFF_FLOOR_MS) of the best, scheduled as they were scored (`name` +
        key names each), timed together in alternation, plus `extra` (their conversion ms). The
        others keep their first timing, scaled by how the first timings' best moved between the
        two moments."""
        finite = {k: ms for k, ms in scores.items() if np.isfinite(ms)}
        if not self.measuring or not finite:
            return scores, {}
        best = min(finite.values())
        close = [k for k, ms in finite.items() if ms <= RUNOFF_WITHIN * best + RUNOFF_FLOOR_MS]
        if len(close) < 2:
            return scores, {}
        times = self._time_together([kernel(k) for k in close], [name + k for k in close])
        again = {k: t + (extra or {}).get(k, 0.0) for k, t in zip(close, times) if t is not None and np.isfinite(t)}
        if len(again) < 2:
            return scores, {}
        ref = min(again, key=finite.get)                 # the first timings' best among those timed again
        drift = again[ref] / finite[ref] if finite[ref] > 0 else 1.0
        out = {k: round(again[k] if k in again else ms * drift, 4) for k, ms in scores.items()}
        return out, {k: scores[k] for k in again}

    def _time_together(self, funcs: list[tirx.PrimFunc], names: list[str]) -> list[float | None]:
        """ms of each kernel's chosen schedule (from the database: it was just scored), timed in
        one interleaved call under the condition it was scored in (its input just written)."""
        scheduled = [self.gensor.schedule(f, n)[0] for f, n in zip(funcs, names)]
        return [t * 1e3 if t is not None else None for t in self.scheduler.time(scheduled, written_first=True)]

    @staticmethod
    def _worth_ahead(scores: dict[str, float]) -> list[int]:
        """Output blocks whose own score is within LOOKAHEAD_WITHIN of the best alone."""
        best_alone = min(scores.values())
        return sorted({int(_out(k)) for k, ms in scores.items() if ms <= LOOKAHEAD_WITHIN * best_alone})

    def _ahead(self, scores: dict[str, float], next_conv: NextConv) -> dict[str, float]:
        """The next conv's best score for each output block worth looking ahead for."""
        nxt = next_conv.site
        return {str(o): min(self._scores(nxt, o, candidates(nxt, o, self.lanes, next_conv.allowed_out,
                                                             self.half)).values())
                for o in self._worth_ahead(scores)}

    def _pool_scores(self, scores: dict[str, float], pool: PoolSite) -> dict[str, float]:
        """The pooling's time in each output block worth looking ahead for."""
        return {str(o): round(self._score_pool(pool, o), 4) for o in self._worth_ahead(scores)}

    def _score_pool(self, pool: PoolSite, block: int) -> float:
        return self._score_func(pool.kernel(block), f"layout pool {'x'.join(map(str, pool.data))} {block}")

    def decide(self, site: ConvSite, incoming: int, allowed_out: tuple[int, ...] | None = None,
               next_conv: NextConv | None = None, pool: PoolSite | None = None,
               padding: PadContext | None = None) -> Decision:
        """The conv's layouts, and whether it computes its output channels padded (then the
        decision is the padded site's, with `padded_from` set). `padding` says where padded
        channels would go (padflow.py): forced, the conv pads to match a padded tensor it meets;
        where they flow into every reader no slice is charged, and the reading convs' best times
        for the block written count on both sides (a 72-channel depthwise conv runs NCHW, an
        80-channel one blocked), and padding may cost up to 1 / PAD_GAIN of not padding: the
        blocked tensor pays again in the convs beyond."""
        padding = padding or PadContext()
        d = self._decide(site, incoming, allowed_out, next_conv, pool)
        padded = site.padded(self.lanes) if self.pad and padding.own else None
        if padded is None:
            return d
        # taken back before what it meets (not flowing on, not matching a padded partner), the padded
        # output is NCHW there: the blocks the real channels allow do not bind it (ShuffleNetV2's
        # 232-channel convs into a concat: only NCHW, 0.12 ms; padded to 240 in 16c, 0.04 + 0.002 back)
        p = self._decide(padded, incoming, allowed_out if padding.flows or padding.forced else None)
        blocked = {k: ms for k, ms in p.scores.items() if int(_out(k)) > 1}
        if not blocked:
            return d
        own = d.scores.get(f"{d.data_block}/{d.out_block}", min(d.scores.values(), default=float("inf")))
        totals = {k: ms + (0.0 if padding.flows else self._back_ms(padded, int(_out(k)))) for k, ms in blocked.items()}
        for reader in padding.readers:
            padded_reader = reader.reading(padded.out_channels)
            totals = {k: ms + self._best(padded_reader, int(_out(k))) for k, ms in totals.items()}
            own += self._best(reader, d.out_block)
        best = min(totals, key=totals.get)
        gain = 1 / PAD_GAIN if padding.flows else PAD_GAIN      # flowing on, blocks pay further down too
        if totals[best] > gain * own and not padding.forced:
            return d
        data_block, out_block = (int(x) for x in best.split("/"))
        return replace(p, data_block=data_block, out_block=out_block,
                       w_in=padded.weight_blocks(data_block, out_block)[0], w_out=out_block,
                       ahead={}, pool={}, padded_from=site.out_channels)

    def _back_ms(self, padded: ConvSite, block: int) -> float:
        """A padded output's way back to NCHW for readers that take the real channels."""
        return self.conversions.ms(padded.out_shape, padded.dtype, block, 1)

    def _best(self, site: ConvSite, incoming: int) -> float:
        """The best score of `site` reading `incoming`'s block, its output channels padded or not."""
        best = min(self._scores(site, incoming, candidates(site, incoming, self.lanes, half=self.half)).values())
        padded = site.padded(self.lanes) if self.pad else None
        if padded is None:
            return best
        pairs = candidates(padded, incoming, self.lanes, half=self.half)
        blocked = [ms for k, ms in self._scores(padded, incoming, pairs).items() if int(_out(k)) > 1]
        return min([best, *blocked])

    def _decide(self, site: ConvSite, incoming: int, allowed_out: tuple[int, ...] | None = None,
                next_conv: NextConv | None = None, pool: PoolSite | None = None) -> Decision:
        pairs = candidates(site, incoming, self.lanes, allowed_out, self.half)
        context = f"/in{incoming}/{pairs}" + (f"/next{next_conv.key()}" if next_conv is not None else "") + \
            (f"/pool{pool.key()}" if pool is not None else "")
        key = f"layout/{self.gensor.target_key}/{site.key()}{context}"
        rec = self.db.get(key, measured_only=self.measuring, kind="layout")
        if rec is not None:
            return Decision.from_record(rec)
        class_key = f"layout/{self.gensor.target_key}/{site.class_key()}{context}"
        shared = self.db.get(class_key, measured_only=self.measuring, kind="layout") if class_key != key else None
        if shared is not None:
            d = Decision.from_record(shared)
            d = replace(d, w_in=site.weight_blocks(d.data_block, d.out_block)[0], reused=False,
                        shared_from=d.shared_from or shared.get("site", ""))
            self.db.put(key, d.record(), "layout", self.gensor.target_key)
            return d
        scores = self._scores(site, incoming, pairs)
        scores, first = self._runoff(
            scores, lambda k: site.kernel(*(int(x) for x in k.split("/"))), f"layout conv {_site_name(site)} ",
            {k: self._conversion_ms(site, incoming, int(k.split("/")[0])) for k in scores})
        ahead = self._ahead(scores, next_conv) if next_conv is not None else {}
        pooled = self._pool_scores(scores, pool) if pool is not None else {}
        looked = set(ahead) | set(pooled)
        total = {k: ms + ahead.get(_out(k), 0.0) + pooled.get(_out(k), 0.0) for k, ms in scores.items()
                 if _out(k) in looked} or scores
        best = min(total, key=total.get)
        if first:                                  # timed together: near-equal ones settle the same way
            tied = [k for k, ms in total.items() if ms <= TIE * total[best] + TIE_FLOOR_MS]
            best = min(tied, key=lambda k: (_preferred(k, incoming, self.lanes), total[k]))
        data_block, out_block = (int(x) for x in best.split("/"))
        d = Decision(data_block, out_block, *site.weight_blocks(data_block, out_block), scores, self.measuring,
                     ahead=ahead, pool=pooled, runoff=first)
        self.db.put(key, d.record(), "layout", self.gensor.target_key)
        if class_key != key:
            self.db.put(class_key, {**d.record(), "site": _site_name(site)}, "layout", self.gensor.target_key)
        return d

    def save(self) -> None:
        self.db.save()

    def decide_matmul(self, site: MatmulSite) -> MatmulDecision:
        """Panel width n_t for a constant-weight matmul (0 = row-major). Measured only: the packed
        index (j // n_t, j % n_t) is not affine, so Gensor's analytical model cannot rank it; a
        target that does not run here (and has no RPC device) keeps row-major weights."""
        if not self.measuring:
            return MatmulDecision(0, {}, False)
        # where n_t does not divide N the last panel is zero-padded and the kernel computes the padded
        # width (its vector split whole) then stores N columns: GPT-2's 50257-wide LM head took 22 ms
        # so against 33 ms row-major (an N-wide output without the padded compute lost its vector
        # split: 16x slower, so the padded width is what makes it pay)
        widths = [0, self.lanes, 2 * self.lanes, 4 * self.lanes]
        key = f"layout/{self.gensor.target_key}/{site.key()}/{widths}"
        rec = self.db.get(key, measured_only=True, kind="layout")
        if rec is not None:
            return MatmulDecision(rec["nt"], rec.get("scores", {}), True, reused=True, runoff=rec.get("runoff", {}))
        scores = {str(nt): round(self._score_func(site.kernel(nt), f"layout {site.key()} n_t={nt}"), 4) for nt in widths}
        scores, first = self._runoff(scores, lambda k: site.kernel(int(k)), f"layout {site.key()} n_t=")
        nt = int(min(scores, key=scores.get))
        self.db.put(key, {"nt": nt, "scores": scores, "measured": True, **({"runoff": first} if first else {})},
                    "layout", self.gensor.target_key)
        return MatmulDecision(nt, scores, True, runoff=first)


@dataclass
class MatmulDecision:
    nt: int                                   # panel width; 0 = row-major B
    scores: dict[str, float]
    measured: bool
    reused: bool = False
    runoff: dict[str, float] = field(default_factory=dict)   # first timings of the candidates timed again

    @property
    def changed_by_runoff(self) -> bool:
        return _changed(self.runoff, self.scores)
