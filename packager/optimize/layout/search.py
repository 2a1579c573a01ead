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
producer's block, or v when the producer writes NCHW. A conv whose output channels are not whole
blocks also scores its blocked candidates with the channels padded (pad.py), and computes the
padding where that beats its best unpadded candidate by PAD_GAIN, a conversion back to NCHW
included. A conv is scored with a transcendental epilogue (SiLU, GELU, ...) when one follows,
as its kernel will compute it. Unfold (overlapped spatial tiles) and spatial layout tiling are
not searched here.

Decisions are shared within a shape class (ConvSite.class_key: the same conv but for its input
channels, rounded up to a power of two, in the same context): the first conv of a class is
scored, the others take its layouts (the report names the conv they came from).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import numpy as np
from tvm import relax, te, topi

from ..fastmath import fast_silu
from ..schedule.contract import KernelScheduler
from ..schedule.hardware import MEMORY_BOUND_REDUCTION
from .conv import ConvLayouts, conv2d_packed
from .matmul import MatmulSite
from .pad import padded_channels
from .primitives import layout_name

SEARCH_TOP_K = 2              # tile plans measured per layout candidate
LOOKAHEAD_WITHIN = 1.5        # output blocks scored with the next conv: own score within 1.5x of the best
PAD_GAIN = 0.9                # padded output channels: chosen when at most 0.9x the best unpadded score
PAD_AT_MOST = 2.0             # padded channels scored when at most 2x the real ones (18 -> 32, not 3 -> 16)


@dataclass(frozen=True)
class ConvSite:
    """One relax.nn.conv2d (NCHW / OIHW) as the search sees it."""

    data: tuple[int, int, int, int]
    weight: tuple[int, int, int, int]
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]
    dilation: tuple[int, int]
    groups: int
    dtype: str
    epilogue: str = ""        # "silu": a sigmoid/tanh/exp-like op follows (fused into the conv's kernel)
    out_dtype: str = ""       # the accumulator's type where it is not `dtype` (fp16 operands, fp32 sums)

    @staticmethod
    def of(call: relax.Call) -> "ConvSite":
        a = call.attrs
        dtype, out = str(call.args[0].ty.dtype), str(a.out_dtype) if a.out_dtype else ""
        return ConvSite(tuple(int(d) for d in call.args[0].ty.shape), tuple(int(d) for d in call.args[1].ty.shape),
                        tuple(int(s) for s in a.strides), tuple(int(p) for p in a.padding),
                        tuple(int(d) for d in a.dilation), int(a.groups), dtype,
                        out_dtype="" if out in ("", "void", dtype) else out)

    @property
    def channels(self) -> int:
        return self.data[1]

    @property
    def out_channels(self) -> int:
        return self.weight[0]

    @property
    def memory_bound(self) -> bool:
        """Few products per output (a depthwise conv, a 1x1 conv from few channels): its input's
        layout decides how fast it streams, and no reuse amortizes it."""
        return self.weight[1] * self.weight[2] * self.weight[3] <= MEMORY_BOUND_REDUCTION

    @property
    def out_elements(self) -> int:
        """Elements of the output tensor."""
        n, _, h, w = self.data
        kh, kw = self.weight[2:]
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = self.strides, self.dilation, self.padding
        return n * self.out_channels * ((h + pt + pb - (kh - 1) * dh - 1) // sh + 1) * \
            ((w + pl + pr - (kw - 1) * dw - 1) // sw + 1)

    def padded(self, lanes: int) -> "ConvSite | None":
        """The same conv computing each group's output channels rounded up to whole `lanes`
        blocks, when no block of `lanes` is valid without (neither whole blocks nor a block
        spanning whole groups) and the padding costs at most PAD_AT_MOST times the work; else
        None."""
        og = self.out_channels // self.groups
        p = padded_channels(og, lanes)
        if og % lanes == 0 or (self.groups > 1 and lanes % og == 0) or p > PAD_AT_MOST * og:
            return None
        return replace(self, weight=(p * self.groups, *self.weight[1:]))

    def weight_blocks(self, data_block: int, out_block: int) -> tuple[int, int]:
        """The weight's (i, o) blocks: i follows the input block when it divides C/groups."""
        cg = self.weight[1]
        w_in = data_block if data_block > 1 and cg % data_block == 0 else 1
        return w_in, out_block

    def valid(self, data_block: int, out_block: int) -> bool:
        og = self.out_channels // self.groups
        if self.channels % data_block or self.out_channels % out_block:
            return False
        return not (self.groups > 1 and out_block > 1 and og % out_block and out_block % og)

    def kernel(self, data_block: int, out_block: int):
        """The conv alone (no epilogue) over the candidate's layouts, as a PrimFunc."""
        n, c, h, w = self.data
        x = te.placeholder((n, c // data_block, h, w, data_block) if data_block > 1 else self.data, self.dtype, "x")
        w_in, w_out = self.weight_blocks(data_block, out_block)
        o, cg, kh, kw = self.weight
        wt = te.placeholder((o // w_out, cg // w_in, kh, kw, w_in, w_out), self.dtype, "w")
        y = conv2d_packed(x, wt, ConvLayouts(data_block, w_in, w_out, out_block), c, o, self.strides, self.padding,
                          self.dilation, self.groups, self.out_dtype or self.dtype)
        if self.epilogue:
            y = fast_silu(y)
        return te.create_prim_func([x, wt, y])

    def _fields(self) -> list:
        return [self.data, self.weight, self.strides, self.padding, self.dilation, self.groups, self.dtype] + \
            ([self.epilogue] if self.epilogue else []) + ([self.out_dtype] if self.out_dtype else [])

    def key(self) -> str:
        return json.dumps(self._fields())

    def class_key(self) -> str:
        """The key of the site's shape class: input channels rounded up to a power of two (a
        plain conv's only), so convs that differ only in how many channels they read share
        their layouts: a DenseNet block's 1x1 convs each read 32 more channels than the one
        before, at the same size and output."""
        if self.groups != 1:
            return self.key()
        c = 1 << (self.channels - 1).bit_length()
        return json.dumps([(self.data[0], c, *self.data[2:]), (self.weight[0], c, *self.weight[2:]), self.strides,
                           self.padding, self.dilation, self.groups, self.dtype, "class"] +
                          ([self.epilogue] if self.epilogue else []) + ([self.out_dtype] if self.out_dtype else []))


@dataclass(frozen=True)
class NextConv:
    """The one conv that reads a conv's output (through element-wise ops), as its decision will
    see it: the producer's output block becomes its input block."""

    site: ConvSite
    allowed_out: tuple[int, ...] | None = None

    def key(self) -> str:
        return json.dumps([json.loads(self.site.key()), self.allowed_out])


@dataclass(frozen=True)
class PoolSite:
    """A max or average pooling (NCHW) that alone reads a conv's output: propagation runs it in
    the conv's output block, so its time in each block is part of that conv's choice."""

    data: tuple[int, int, int, int]
    kind: str                                   # "max" or "avg"
    pool_size: tuple[int, int]
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]
    dilation: tuple[int, int]
    ceil_mode: bool
    count_include_pad: bool
    dtype: str

    @staticmethod
    def of(call: relax.Call) -> "PoolSite":
        a = call.attrs
        return PoolSite(tuple(int(d) for d in call.args[0].ty.shape), call.op.name.split(".")[-1][:3],
                        tuple(int(k) for k in a.pool_size), tuple(int(s) for s in a.strides),
                        tuple(int(p) for p in a.padding), tuple(int(d) for d in a.dilation), bool(a.ceil_mode),
                        bool(getattr(a, "count_include_pad", False)), str(call.args[0].ty.dtype))

    def kernel(self, block: int):
        """The pooling over NCHW{block}c as relax legalizes it (topi.nn.pool2d), as a PrimFunc."""
        n, c, h, w = self.data
        x = te.placeholder((n, c // block, h, w, block) if block > 1 else self.data, self.dtype, "x")
        y = topi.nn.pool2d(x, self.pool_size, self.strides, self.dilation, self.padding, self.kind, self.ceil_mode,
                           layout_name("NCHW", block), self.count_include_pad)
        return te.create_prim_func([x, y])

    def key(self) -> str:
        return json.dumps([self.data, self.kind, self.pool_size, self.strides, self.padding, self.dilation,
                           self.ceil_mode, self.count_include_pad, self.dtype])


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
                **({"shared_from": self.shared_from} if self.shared_from else {})}

    @staticmethod
    def from_record(r: dict) -> "Decision":
        return Decision(r["data_block"], r["out_block"], r["w_in"], r["w_out"], r.get("scores", {}),
                        r.get("measured", False), reused=True, ahead=r.get("ahead", {}), pool=r.get("pool", {}),
                        shared_from=r.get("shared_from", ""))


def _site_name(site: ConvSite) -> str:
    return f"{'x'.join(map(str, site.data))}*{'x'.join(map(str, site.weight))}"


def _out(candidate: str) -> str:
    """The output block of a "data/out" candidate key."""
    return candidate.split("/")[1]


def candidates(site: ConvSite, incoming: int, lanes: int, allowed_out: tuple[int, ...] | None = None
               ) -> list[tuple[int, int]]:
    """(data block, output block) pairs to score: the producer's layout as input (and, after a
    plain NCHW producer, one converted to v lanes) x output blocks 1, v, 2v (or `allowed_out`,
    when the output meets another packed tensor downstream). If none is valid, plain NCHW
    behind a conversion."""
    ins = [incoming] + ([lanes] if incoming == 1 else [])
    outs = allowed_out or (1, lanes, 2 * lanes)
    pairs = [(i, o) for i in ins for o in outs if site.valid(i, o)]
    return list(dict.fromkeys(pairs)) or [(1, 1)]


class LayoutSearch:
    """Scores layout candidates with Gensor (same database, same hardware model)."""

    def __init__(self, scheduler: KernelScheduler, pad: bool = True):
        self.pad = pad
        self.db = scheduler.database()
        # No ETO reuse here: candidates are compared with each other, and a reused program's
        # quality (not the layout's) decided between them; from scratch costs the same 3 programs.
        self.gensor = scheduler.searcher(SEARCH_TOP_K, scheduler.opt.measure, db=self.db)
        self.lanes = scheduler.target.vector_lanes_f32
        hw = self.gensor.hw
        dram = hw.level("DRAM").bandwidth * hw.cores * hw.ghz * 1e9          # bytes / s
        self.conversion_ms_per_byte = 2 / dram * 1e3                          # read + write

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
            ms = self._score(site, data_block, out_block)
            if data_block != incoming:
                ms += int(np.prod(site.data)) * 4 * self.conversion_ms_per_byte
            scores[f"{data_block}/{out_block}"] = round(ms, 4)
        return scores

    @staticmethod
    def _worth_ahead(scores: dict[str, float]) -> list[int]:
        """Output blocks whose own score is within LOOKAHEAD_WITHIN of the best alone."""
        best_alone = min(scores.values())
        return sorted({int(_out(k)) for k, ms in scores.items() if ms <= LOOKAHEAD_WITHIN * best_alone})

    def _ahead(self, scores: dict[str, float], next_conv: NextConv) -> dict[str, float]:
        """The next conv's best score for each output block worth looking ahead for."""
        nxt = next_conv.site
        return {str(o): min(self._scores(nxt, o, candidates(nxt, o, self.lanes, next_conv.allowed_out)).values())
                for o in self._worth_ahead(scores)}

    def _pool_scores(self, scores: dict[str, float], pool: PoolSite) -> dict[str, float]:
        """The pooling's time in each output block worth looking ahead for."""
        return {str(o): round(self._score_pool(pool, o), 4) for o in self._worth_ahead(scores)}

    def _score_pool(self, pool: PoolSite, block: int) -> float:
        return self._score_func(pool.kernel(block), f"layout pool {'x'.join(map(str, pool.data))} {block}")

    def decide(self, site: ConvSite, incoming: int, allowed_out: tuple[int, ...] | None = None,
               next_conv: NextConv | None = None, pool: PoolSite | None = None) -> Decision:
        """The conv's layouts, and whether it computes its output channels padded (then the
        decision is the padded site's, with `padded_from` set; its readers see NCHW)."""
        d = self._decide(site, incoming, allowed_out, next_conv, pool)
        padded = site.padded(self.lanes) if self.pad else None
        if padded is None:
            return d
        p = self._decide(padded, incoming)
        blocked = {k: ms for k, ms in p.scores.items() if int(_out(k)) > 1}
        if not blocked:
            return d
        best = min(blocked, key=blocked.get)
        back = padded.out_elements * 4 * self.conversion_ms_per_byte
        own = d.scores.get(f"{d.data_block}/{d.out_block}", min(d.scores.values(), default=float("inf")))
        if blocked[best] + back > PAD_GAIN * own:
            return d
        data_block, out_block = (int(x) for x in best.split("/"))
        return replace(p, data_block=data_block, out_block=out_block,
                       w_in=padded.weight_blocks(data_block, out_block)[0], w_out=out_block,
                       ahead={}, pool={}, padded_from=site.out_channels)

    def _decide(self, site: ConvSite, incoming: int, allowed_out: tuple[int, ...] | None = None,
                next_conv: NextConv | None = None, pool: PoolSite | None = None) -> Decision:
        pairs = candidates(site, incoming, self.lanes, allowed_out)
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
        ahead = self._ahead(scores, next_conv) if next_conv is not None else {}
        pooled = self._pool_scores(scores, pool) if pool is not None else {}
        looked = set(ahead) | set(pooled)
        total = {k: ms + ahead.get(_out(k), 0.0) + pooled.get(_out(k), 0.0) for k, ms in scores.items()
                 if _out(k) in looked} or scores
        best = min(total, key=total.get)
        data_block, out_block = (int(x) for x in best.split("/"))
        d = Decision(data_block, out_block, *site.weight_blocks(data_block, out_block), scores, self.measuring,
                     ahead=ahead, pool=pooled)
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
            return MatmulDecision(rec["nt"], rec.get("scores", {}), True, reused=True)
        scores = {str(nt): round(self._score_func(site.kernel(nt), f"layout {site.key()} n_t={nt}"), 4) for nt in widths}
        nt = int(min(scores, key=scores.get))
        self.db.put(key, {"nt": nt, "scores": scores, "measured": True}, "layout", self.gensor.target_key)
        return MatmulDecision(nt, scores, True)


@dataclass
class MatmulDecision:
    nt: int                                   # panel width; 0 = row-major B
    scores: dict[str, float]
    measured: bool
    reused: bool = False
