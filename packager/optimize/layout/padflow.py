"""Padded channels during the layout walk (propagate.decide_layouts): which tensors will be
computed padded (pad.flows_through, the rule the rewrite in pad.py follows too), and what a
conv's output computed padded would lead to downstream (sites.PadContext, for its decision):

- `flows`: every reader takes the padded channels (a depthwise or plain conv reads them; a binary
  op meets a tensor padded alike, or one that a conv not decided yet writes, which will then pad
  to match): no slice is left behind (MobileNetV3's 24-channel residual chain).
- `forced`: the output meets a tensor already padded alike (an SE block's gate times the
  depthwise conv's output; the second branch of a residual add): the conv pads to match.
- `readers`: the convs that read the output, whose times in each block are part of the choice.
"""
from __future__ import annotations

from tvm import relax

from .pad import Padding, channelwise, flows_through, output_padding, read_output_padding, taken, takes_padding
from .sites import ConvSite, PadContext

WALK_AT_MOST = 64             # bindings followed downstream of one conv
READERS_CHARGED = 4           # reading convs whose time counts in a padding decision


def channels_of(var) -> int | None:
    shape = getattr(getattr(var, "ty", None), "shape", None)
    return int(shape[1]) if shape is not None and len(shape) == 4 else None


def _takes_padding(call, var, pad: Padding | None) -> bool:
    """`call` is a conv that would read `var`'s channels padded (as `pad`)."""
    return takes_padding(call, pad) and call.args[0].same_as(var)


class PadFlow:
    """The Padding each tensor is computed with, as the walk decides the convs in order."""

    def __init__(self, users: dict, producer: dict, lanes: int, flow: bool = True):
        self.users, self.producer, self.lanes, self.flow = users, producer, lanes, flow
        self.padding: dict = {}         # var -> Padding its channels are computed with
        self.decided: set = set()       # conv outputs decided so far

    def visit(self, b) -> bool:
        """Record a non-conv binding's padding: True when it keeps its operands' (else it reads
        them taken back)."""
        p = flows_through(b.value, self.padding.get, self.flow)
        if p is not None:
            self.padding[b.var] = p
        return p is not None

    def conv_input(self, call) -> Padding | None:
        """The padding a conv reads and takes (pad.taken), else None."""
        return taken(call, self.padding.get(call.args[0])) if self.flow else None

    def decided_conv(self, b, site: ConvSite, d, pad_in: Padding | None) -> None:
        """Record a decided conv's output padding: what reading its input's leads to (a depthwise
        or grouped conv computes zero channels for it: pad.read_output_padding), else its own."""
        self.decided.add(b.var)
        p = read_output_padding(b.value, pad_in) or output_padding(site, d)
        if p is not None:
            self.padding[b.var] = p

    def context(self, b, site: ConvSite, site_of) -> PadContext:
        """What padding conv `b`'s output channels would lead to (module docstring); `site_of`
        makes a reading conv's site from its binding."""
        if not self.flow:
            return PadContext()
        walk = self._downstream(b.var)
        if walk is None:
            return PadContext()
        partners, readers = walk
        padded = [self.padding[p] for p in partners if p in self.padding]
        forced = any(p.channels == site.out_channels and p.groups == site.groups for p in padded)
        wider = site.padded(self.lanes)
        pad = Padding(site.out_channels, wider.out_channels, site.groups) if wider is not None else None
        flows = all(_takes_padding(r.value, v, pad) for r, v in readers) and \
            all(p in self.padding or self._undecided_conv(p) for p in partners)
        charged = tuple(site_of(r) for r, _ in readers[:READERS_CHARGED]) if flows else ()
        return PadContext(flows, charged, forced)

    def _downstream(self, var):
        """(partners, readers) of what `var` becomes through channel-wise ops that keep its
        channels: the other tensors those ops meet, and the (binding, tensor read) of every other
        op reading them; None at a graph output or past WALK_AT_MOST bindings."""
        channels, closure, stack = channels_of(var), {var}, [var]
        partners, readers = set(), {}
        while stack:
            v = stack.pop()
            users = self.users.get(v, [])
            if not users:
                return None
            for u in users:
                if u.var in closure:
                    continue
                if channelwise(u.value) and channels_of(u.var) == channels:
                    closure.add(u.var)
                    stack.append(u.var)
                else:
                    readers.setdefault(u.var, (u, v))
            if len(closure) + len(readers) > WALK_AT_MOST:
                return None
        for v in closure - {var}:
            partners |= {a for a in self.producer[v].value.args if isinstance(a, relax.Var) and a not in closure
                         and channels_of(a) is not None}
        return partners, list(readers.values())

    def _undecided_conv(self, var, depth: int = 0) -> bool:
        """`var` is written by a conv not decided yet, directly or through channel-wise ops."""
        b = self.producer.get(var)
        if b is None or depth > 16 or not isinstance(b.value, relax.Call):     # a split's part: not a conv's
            return False
        if takes_padding(b.value):
            return b.var not in self.decided
        args = [a for a in b.value.args if channels_of(a) is not None]
        return channelwise(b.value) and bool(args) and all(self._undecided_conv(a, depth + 1) for a in args)
