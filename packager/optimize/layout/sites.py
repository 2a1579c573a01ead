"""What the layout search (search.py) scores: a conv as a site, the conv or pooling that alone
reads its output, and what its output channels, computed padded, would lead to downstream."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace

from tvm import relax, te, topi

from ..fastmath import fast_silu
from ..schedule.hardware import MEMORY_BOUND_REDUCTION
from .conv import ConvLayouts, conv2d_packed
from .pad import padded_channels
from .primitives import layout_name

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
    def out_shape(self) -> tuple[int, int, int, int]:
        """The output tensor's NCHW shape."""
        n, _, h, w = self.data
        kh, kw = self.weight[2:]
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = self.strides, self.dilation, self.padding
        return (n, self.out_channels, (h + pt + pb - (kh - 1) * dh - 1) // sh + 1,
                (w + pl + pr - (kw - 1) * dw - 1) // sw + 1)

    @property
    def out_elements(self) -> int:
        """Elements of the output tensor."""
        n, c, h, w = self.out_shape
        return n * c * h * w

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

    @property
    def depthwise(self) -> bool:
        return self.weight[1] == 1 and self.groups == self.channels == self.out_channels

    def reading(self, channels: int) -> "ConvSite":
        """The same conv reading `channels` input channels, the real ones among them padded
        (pad.takes_padding): a depthwise conv computes the padded channels too (zero filters), a
        grouped one reads them as extra groups (zero filters), a plain conv takes them with zero
        weights."""
        n, _, h, w = self.data
        o, cg, kh, kw = self.weight
        if self.groups > 1:                      # depthwise: one channel per group
            groups = channels // cg
            return replace(self, data=(n, channels, h, w), weight=(groups * (o // self.groups), cg, kh, kw),
                           groups=groups)
        return replace(self, data=(n, channels, h, w), weight=(o, channels, kh, kw))

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


@dataclass(frozen=True)
class PadContext:
    """What computing a conv's output channels padded leads to downstream (padflow.py)."""

    flows: bool = False                 # every reader takes the padded channels: no slice is left
    readers: tuple[ConvSite, ...] = ()  # then the convs reading the output, as they read it unpadded
    forced: bool = False                # the output meets a tensor padded alike: pad to match it
    own: bool = True                    # the conv may pad its output (not when it computes its input's on)
