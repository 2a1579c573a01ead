"""The `layout` pass (ALT): per-conv layouts from the joint search, propagated through the graph.

1. Walk `main` in topological order; for every conv2d with constant weights, score its layout
   candidates with the scheduler (search.py), knowing the layout its producer writes (the block
   each tensor will have is tracked through element-wise ops and pooling, as propagation will)
   and, when one memory-bound conv (depthwise, 1x1 from few channels) or one pooling alone reads
   its output, that conv's or pooling's cost for each output block.
2. TVM's ConvertLayout applies the choices: each conv gets its data/kernel/output layout, and the
   layouts flow through element-wise, broadcast (bias and batch-norm constants are re-laid-out),
   pooling, concat and reductions, so producers write the consumer's layout directly; a
   conversion (`layout_transform`) is left only where two layouts really meet. Conversions of
   the same tensor are merged (common subexpressions) and unused ones dropped.
3. Conversions of constants (weights, biases) are folded at build time by FoldConstant after
   legalization: packed weights are stored packed, no layout work at run time.
4. The packed convs are lowered by conv.legalize_conv2d (TE written over the new layouts).
5. Matmuls with constant B get B in n_t panels where measurement says so (matmul.py); their
   A and C keep row-major layouts.

TVM cannot convert one packed block into another (NCHW16c -> NCHW32c): a conv whose output meets
another packed tensor downstream (residual add, concat) may only use that tensor's block, and if
ConvertLayout still refuses the choices, each conv keeps its packed-or-NCHW choice with one block
(v) for all packed tensors, and failing that every conv gets the vector-width block. An op whose
layout inference fails is lowered to a kernel first, with NCHW around it (isolate.py); only when
that does not help either does every conv keep NCHW.

The report lists each conv's chosen layouts and the number of activation conversions: before
propagation (one in front of and one behind every packed conv) and after.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace

import tvm
from tvm import relax
from tvm.ir import expr as ir

from ..relax_util import count_ops, is_const
from ... import progress
from ...targets import Target
from ..base import PassReport
from ..schedule.contract import KernelScheduler
from ..variadic import variadic_to_binary
from .broadcast import propagatable
from .clip import clip_as_ops
from .apply import apply_conv_layouts, bindings, unshare_conv_weights
from .matmul import matmul_site, pack_matmul_weights
from .pad import apply_padding, is_plain_conv, op_name, read_output_padding, taken
from .padflow import PadFlow, channels_of
from .primitives import channel_blocked, conv_weight_blocked
from .memo import ProfileMemo
from .search import HALF_BLOCK_MIN, Decision, LayoutSearch, vector_blocks
from .sites import ConvSite, NextConv, PadContext, PoolSite
from .split import packed_split, splits_as_sections

# Ops through which a channel-blocked layout flows unchanged: element-wise, broadcast binary,
# pooling; each has a layout rule (FRelaxInferLayout) in TVM 0.27, checked by a test.
FOLLOW = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum",
          "relax.nn.relu", "relax.sigmoid", "relax.tanh", "relax.nn.silu", "relax.nn.gelu", "relax.nn.max_pool2d",
          "relax.nn.avg_pool2d", "relax.power", "relax.exp", "relax.nn.prelu", "relax.negative", "relax.sqrt",
          "relax.abs", "relax.erf", "relax.log", "relax.round", "relax.floor", "relax.ceil", "relax.sign",
          "relax.trunc", "relax.cos", "relax.sin", "relax.tan", "relax.square", "relax.rsqrt"}
POOLS = {"relax.nn.max_pool2d", "relax.nn.avg_pool2d"}
REDUCTIONS = {"relax.mean", "relax.sum", "relax.max", "relax.min"}
TRANSCENDENTAL = {"relax.sigmoid", "relax.tanh", "relax.exp", "relax.nn.silu", "relax.nn.gelu", "relax.nn.gelu_tanh"}


def _args(call) -> list:
    out = []
    for a in call.args:
        out.extend(a.fields if isinstance(a, relax.Tuple) else [a])
    return out


def _spatial_keepdims(call) -> bool:
    """A reduction over spatial axes that keeps them (an SE block's global mean): ConvertLayout
    carries a packed layout through it, so the conv reading it must take that block (TVM cannot
    convert NCHW16c into NCHW8c: EfficientNet's squeeze convs failed the whole conversion)."""
    if op_name(call) not in REDUCTIONS or not getattr(call.attrs, "keepdims", False):
        return False
    axes = call.attrs.axis
    return axes is not None and all(int(a) % 4 in (2, 3) for a in axes)


class _Tracker:
    """The channel block each tensor will have after propagation, as ConvertLayout propagates:
    through element-wise ops and pooling (first packed 4-D input of the same channel count), and
    through concat when all inputs share a block."""

    def __init__(self, mod: tvm.IRModule):
        self.block_of: dict = {}
        self.users: dict = defaultdict(list)
        self.producer: dict = {}
        for b in bindings(mod):
            if isinstance(b.value, (relax.Call, relax.TupleGetItem)):
                self.producer[b.var] = b
                for a in _args(b.value) if isinstance(b.value, relax.Call) else [b.value.tuple_value]:
                    self.users[a].append(b)

    def resolve(self, var, depth: int = 0) -> int:
        """The block of `var`, looking up through element-wise producers not visited yet (a branch
        decided earlier may reach the meeting point through ops that come later in the walk)."""
        if var in self.block_of or depth > 32:
            return self.block_of.get(var, 1)
        b = self.producer.get(var)
        if b is not None and isinstance(b.value, relax.TupleGetItem):
            return self.resolve(b.value.tuple_value, depth + 1)
        if b is not None and op_name(b.value) == "relax.split":
            block = self.resolve(b.value.args[0], depth + 1)
            return block if packed_split(b.value, block) else 1
        if b is None or op_name(b.value) not in FOLLOW:
            return 1
        return max((self.resolve(a, depth + 1) for a in b.value.args if isinstance(a, relax.Var)), default=1)

    def visit(self, b, sliced=frozenset()) -> None:
        """Track `b`'s output block; an operand in `sliced` is read through a slice of its padded
        channels (pad.py), so in NCHW."""
        call, op = b.value, op_name(b.value)
        shape = getattr(b.var.ty, "shape", None)
        block = {a: 1 if a in sliced else self.block_of.get(a, 1) for a in _args(call)}
        if (op in FOLLOW or _spatial_keepdims(call)) and shape is not None and len(shape) == 4:
            for a in call.args:
                a_shape = getattr(getattr(a, "ty", None), "shape", None)
                if block.get(a, 1) > 1 and a_shape is not None and len(a_shape) == 4 \
                        and int(a_shape[1]) == int(shape[1]):
                    self.block_of[b.var] = block[a]
                    return
        elif op == "relax.concat":
            blocks = {block.get(a, 1) for a in _args(call)}
            if len(blocks) == 1 and blocks != {1}:
                self.block_of[b.var] = blocks.pop()
        elif op == "relax.split" and packed_split(call, block.get(call.args[0], 1)):
            self.block_of[b.var] = block[call.args[0]]

    def visit_item(self, b) -> None:
        """A part of a split keeps the split's block (ConvertLayout keeps packed parts packed)."""
        if b.value.tuple_value in self.block_of:
            self.block_of[b.var] = self.block_of[b.value.tuple_value]

    def next_conv(self, var):
        """The binding of the plain conv that alone reads `var`, directly or through element-wise
        ops and pooling that keep its channels and lead nowhere else; else None."""
        return self._alone_reader(var, lambda b, v: is_plain_conv(b.value) and b.value.args[0].same_as(v))

    def pool_after(self, var):
        """The binding of the 2-D pooling that alone reads `var`, directly or through element-wise
        ops that keep its channels and lead nowhere else (it runs in `var`'s block); else None."""
        return self._alone_reader(var, lambda b, v: op_name(b.value) in POOLS)

    def _alone_reader(self, var, wanted):
        """The one binding that reads what `var` becomes through channel-keeping FOLLOW ops,
        accepted by `wanted(binding, tensor it reads)`; None when those ops lead to more than one
        other reader (or to a graph output). The FOLLOW ops may branch and meet again: SiLU as
        x * sigmoid(x), HardSwish as x * clip(x + 3) / 6 read the conv output twice."""
        closure, stack, readers = {var}, [var], {}
        while stack:
            v = stack.pop()
            users = self.users.get(v, [])
            if not users:
                return None                                 # a graph output (or dead)
            for b in users:
                if b.var in closure:
                    continue
                if wanted(b, v) or not self._keeps_channels(b, v):
                    readers.setdefault(b.var, (b, v))
                    continue
                closure.add(b.var)
                stack.append(b.var)
            if len(closure) > 64 or len(readers) > 1:
                return None
        if len(readers) != 1:
            return None
        b, v = next(iter(readers.values()))
        return b if wanted(b, v) else None

    def epilogue(self, var) -> str:
        """"silu" when the channel-keeping element-wise ops after `var` (what fusion puts into its
        conv's kernel) include a sigmoid, tanh, exp, SiLU or GELU, else "": tens of operations
        per output in the write-back, whose cost depends on the tile the layout gives it."""
        closure, stack = {var}, [var]
        while stack and len(closure) <= 64:
            v = stack.pop()
            for b in self.users.get(v, []):
                if b.var in closure or not self._keeps_channels(b, v) or op_name(b.value) in POOLS:
                    continue
                if op_name(b.value) in TRANSCENDENTAL:
                    return "silu"
                closure.add(b.var)
                stack.append(b.var)
        return ""

    @staticmethod
    def _keeps_channels(b, v) -> bool:
        """`b` is a FOLLOW op (not a conv) whose 4-D output has `v`'s channels."""
        shape, out = getattr(v.ty, "shape", None), getattr(b.var.ty, "shape", None)
        return op_name(b.value) in FOLLOW and not is_plain_conv(b.value) and shape is not None \
            and out is not None and len(out) == 4 and int(out[1]) == int(shape[1])

    def allowed_out(self, var, lanes: int, half: bool = True) -> tuple[int, ...] | None:
        """The output blocks a conv writing `var` may use, None where it is free: the block of the
        packed tensors it meets (see partners), and in a channel concat only blocks dividing every
        operand's channels. Inception's 192/208/48/64-channel branches: a first branch that took
        32 left the 208- and 48-channel ones NCHW (and with them every conv reading the concat)."""
        partners, channels = self.partners(var)
        if not partners and not channels:
            return None
        if len(partners) > 1:
            return (1,)
        blocks = tuple(partners) or vector_blocks(lanes, *channels, half=half)
        return (1, *(blk for blk in blocks if all(c % blk == 0 for c in channels)))

    def partners(self, var) -> tuple[set[int], set[int]]:
        """Blocks of the tensors that `var` meets downstream (through element-wise ops) in a
        binary op or concat: TVM cannot convert one packed block into another there, so a conv
        writing `var` must use the same block (or NCHW); and the channels of every operand of a
        channel concat met (each must be whole blocks)."""
        found, channels, seen, stack = set(), set(), {var}, [var]
        while stack:
            v = stack.pop()
            for b in self.users.get(v, []):
                op = op_name(b.value)
                if op == "relax.split" or isinstance(b.value, relax.TupleGetItem):   # its parts meet what v meets
                    if b.var not in seen:
                        seen.add(b.var)
                        stack.append(b.var)
                    continue
                if op not in FOLLOW and op != "relax.concat":
                    continue
                found |= {blk for a in _args(b.value) if isinstance(a, relax.Var) and not a.same_as(v)
                          and (blk := self.resolve(a)) > 1}
                if op == "relax.concat" and b.value.attrs.axis is not None and int(b.value.attrs.axis) in (1, -3):
                    channels |= {c for a in _args(b.value) if (c := channels_of(a)) is not None}
                if b.var not in seen:
                    seen.add(b.var)
                    stack.append(b.var)
        return found, channels


def decide_layouts(mod: tvm.IRModule, search: LayoutSearch, lanes: int, flow: bool = True, half: bool = True
                   ) -> list[tuple[ir.Constant, ConvSite, Decision]]:
    """Topological walk: (weight constant, site, decision) per conv. Padded output channels flow
    on as pad.flows_through says (padflow.py; the rewrite in apply_padding follows the same rule):
    a conv reading them is scored with them (ConvSite.reading), a reader they do not flow into
    reads them taken back, in NCHW."""
    track = _Tracker(mod)
    pads = PadFlow(track.users, track.producer, lanes, flow)
    out = []
    convs = sum(1 for b in bindings(mod) if isinstance(b.value, relax.Call) and is_plain_conv(b.value))
    with progress.task("layout candidates", convs, "convs") as bar:
        for b in bindings(mod):
            call = b.value
            if isinstance(call, relax.TupleGetItem):
                track.visit_item(b)
            if not isinstance(call, relax.Call):
                continue
            if not is_plain_conv(call):
                track.visit(b, sliced={} if pads.visit(b) else pads.padding)
                continue
            pad_in = pads.conv_input(call)
            pad_out = read_output_padding(call, pad_in)     # a depthwise or grouped conv computes it on
            site = replace(ConvSite.of(call), epilogue=track.epilogue(b.var))
            if pad_in is not None:
                site = site.reading(pad_in.padded)
            nxt = track.next_conv(b.var)
            nxt_site = replace(ConvSite.of(nxt.value), epilogue=track.epilogue(nxt.var)) if nxt is not None else None
            if nxt_site is not None and pad_out is not None and taken(nxt.value, pad_out):
                nxt_site = nxt_site.reading(pad_out.padded)     # the padding flows on
            ahead = NextConv(nxt_site, track.allowed_out(nxt.var, lanes, half)) if nxt_site and nxt_site.memory_bound else None
            pool = PoolSite.of(p.value) if (p := track.pool_after(b.var)) is not None else None
            incoming = 1 if call.args[0] in pads.padding and pad_in is None else track.block_of.get(call.args[0], 1)
            context = pads.context(b, site, lambda r: replace(ConvSite.of(r.value), epilogue=track.epilogue(r.var))) \
                if pad_out is None else PadContext(own=False)
            d = search.decide(site, incoming, track.allowed_out(b.var, lanes, half), ahead, pool, context)
            out.append((call.args[1], site, d))
            pads.decided_conv(b, site, d, pad_in)
            track.block_of[b.var] = d.out_block
            bar.advance()
    return out


def sites_match(mod: tvm.IRModule, decisions) -> bool:
    """Every decided conv of `mod` (found by its weight constant) has the shape it was scored with."""
    by_weight = {b.value.args[1]: ConvSite.of(b.value) for b in bindings(mod) if is_plain_conv(b.value)}
    return all((got := by_weight.get(w)) is not None and (got.data, got.weight, got.groups) == (s.data, s.weight, s.groups)
               for w, s, _ in decisions)


def _count_conversions(mod: tvm.IRModule) -> tuple[int, int]:
    """(activation conversions, conversions of values computed from constants only: folded at
    build time)."""
    act = const = 0
    from_consts: set = set()

    def constant(e) -> bool:
        return is_const(e) or e in from_consts

    for b in bindings(mod):
        v = b.value
        if isinstance(v, relax.Call) and all(constant(a) for a in v.args if not isinstance(a, relax.ShapeExpr)):
            from_consts.add(b.var)
        if op_name(v) == "relax.layout_transform":
            if constant(v.args[0]):
                const += 1
            else:
                act += 1
    return act, const


def _conv_details(decisions) -> list[dict]:
    out = []
    for _, s, d in decisions:
        out.append({"data": list(s.data), "weight": list(s.weight), "groups": s.groups, "layouts": list(d.layouts()),
                    "primitives": {"data": channel_blocked(s.data, 1, d.data_block).describe(),
                                   "weight": conv_weight_blocked(s.weight, d.w_in, d.w_out).describe(),
                                   "output": channel_blocked((s.data[0], s.weight[0], 1, 1), 1, d.out_block).describe()},
                    "scores_ms": d.scores, "next_conv_ms": d.ahead, "pool_ms": d.pool, "from_database": d.reused,
                    **({"first_timing_ms": d.runoff} if d.runoff else {}),
                    **({"shared_from": d.shared_from} if d.shared_from else {}),
                    **({"padded_from": d.padded_from} if d.padded_from else {})})
    return out


def keep_nchw(mod: tvm.IRModule, target: Target) -> tuple[tvm.IRModule, PassReport]:
    """The layout pass of GPU targets: ONNX layouts stay, and the report says why."""
    return mod, PassReport("layout", "applied", f"{target.name}: NCHW kept for every conv (GPU default: W innermost is "
                           "the threadIdx.x axis of the CUDA schedules, so loads coalesce); channel-blocked "
                           "GPU layouts and weight panels are not searched in this version", {"convs": 0, "packed": 0})


def alter_layouts(mod: tvm.IRModule, scheduler: KernelScheduler, search=None, memo: ProfileMemo | None = None,
                  pad: bool = True, half: bool = True) -> tuple[tvm.IRModule, PassReport]:
    """Relax (NCHW) in -> Relax with per-conv packed layouts, propagated conversions and packed
    matmul weights out. `search` (tests) replaces the joint search: anything with
    decide(site, incoming), decide_matmul(site), save() and `measuring`. `memo` carries the
    first shape profile's choices to the others. `pad` lets convs compute their output channels
    padded to whole blocks (optimize.passes.pad_channels), `half` offers half-vector blocks
    (optimize.passes.half_blocks)."""
    mod, clips = clip_as_ops(variadic_to_binary(mod))   # ONNX Max/Min/Sum/Mean as binary ops, not stack + reduce
    mod, splits = splits_as_sections(mod)
    mod, bns, promoted = propagatable(mod)
    mod, _ = unshare_conv_weights(mod)
    target = scheduler.target
    search = search or LayoutSearch(scheduler, pad, half)
    if memo is not None:
        search = memo.wrap(search)
    decisions = decide_layouts(mod, search, target.vector_lanes_f32, half=half)
    matmuls = [(b.value.args[1], site, search.decide_matmul(site)) for b in bindings(mod)
               if isinstance(b.value, relax.Call) and (site := matmul_site(b.value)) is not None]
    search.save()
    slices = count_ops(mod).get("relax.strided_slice", 0)
    groups = {b.value.args[1]: int(b.value.attrs.groups) for b in bindings(mod) if is_plain_conv(b.value)}
    padded_mod, padded = apply_padding(mod, decisions)
    flowed = sites_match(padded_mod, padded)
    if not flowed:                                   # the walk and the rewrite disagree: a bug, not a
        decisions = decide_layouts(mod, search, target.vector_lanes_f32, flow=False, half=half)   # choice; padding stops at the epilogue
        padded_mod, padded = apply_padding(mod, decisions, flow=False)
    extra = sum(1 for w, st, _ in decisions if not st.depthwise and groups.get(w, st.groups) not in (1, st.groups))
    mod, decisions = padded_mod, padded
    slices = count_ops(mod).get("relax.strided_slice", 0) - slices
    converted, decisions, note = apply_conv_layouts(mod, decisions, target.vector_lanes_f32)
    converted, n_panels = pack_matmul_weights(converted, [(c, d.nt) for c, _, d in matmuls if d.nt])
    packed = [d for _, _, d in decisions if (d.data_block, d.out_block) != (1, 1)]
    act, const = _count_conversions(converted)
    how = f"measured on {scheduler.where_measured()}" if search.measuring else "analytical (Gensor estimate)"
    chosen = Counter("/".join(d.layouts()) for _, _, d in decisions)
    conv_part = (f"{len(packed)}/{len(decisions)} convs packed ({', '.join(f'{n}x {k}' for k, n in chosen.most_common())}); "
                 f"activation conversions {2 * len(packed)} before propagation -> {act} after; {const} weight/bias "
                 f"re-layouts folded at build time; {clips} Clip/LeakyRelu/PRelu as max/min ops, {bns} BatchNorm(s) (as element-wise ops), "
                 f"{splits} split(s) into equal parts (as sections) and {promoted} lower-rank broadcast constant(s) "
                 "made propagatable"
                 if decisions else "no convs")
    widths = Counter(d.nt for _, _, d in matmuls if d.nt)
    mm_part = (f"{n_panels}/{len(matmuls)} constant-weight matmuls with B in n_t panels "
               f"({', '.join(f'{n}x n_t={w}' for w, n in sorted(widths.items()))})" if search.measuring else
               f"{len(matmuls)} constant-weight matmuls kept row-major (panels are chosen by measurement only)")
    ahead = [d for _, _, d in decisions if d.ahead]
    changed = sum(d.changed_by_lookahead for d in ahead)
    if ahead:
        conv_part += (f"; {len(ahead)} convs chose their output block with the cost of the conv reading it, "
                      f"{changed} of them another block than their own time alone")
    pooled = [d for _, _, d in decisions if d.pool]
    pool_changed = sum(d.changed_by_lookahead for d in pooled)
    if pooled:
        conv_part += (f"; {len(pooled)} convs chose their output block with the time of the pooling after them, "
                      f"{pool_changed} of them another block than their own time alone")
    shared = sum(bool(getattr(d, "shared_from", "")) for _, _, d in decisions)
    if shared:
        conv_part += (f"; {shared} convs took the layouts of a conv of their shape class (input channels rounded "
                      "up to a power of two) instead of being scored")
    runoff = [d for _, _, d in decisions if d.runoff] + [d for _, _, d in matmuls if d.runoff]
    runoff_changed = sum(d.changed_by_runoff for d in runoff)
    if runoff:
        conv_part += (f"; {len(runoff)} decisions timed their close candidates again together (run-off), "
                      f"{runoff_changed} of them ranked another candidate first than its own first timing")
    padded = [f"{d.padded_from}->{s.out_channels}" + (f" in {s.groups} groups" if s.groups > 1 else "")
              for _, s, d in decisions if d.padded_from]
    if padded:
        kinds = ", ".join(f"{n}x {k}" for k, n in Counter(padded).most_common())
        conv_part += (f"; {len(padded)} convs compute their output channels padded to whole blocks "
                      f"({kinds}); " + ("the padding carried on into the convs reading it" +
                                        (f" ({extra} grouped conv(s) reading it as extra zero groups)" if extra else "")
                                        + f", {slices} slice(s) "
                                        "taking it back before other readers" if flowed else
                                        "sliced back after their element-wise epilogue (the padding walk and "
                                        "rewrite disagreed)"))
    halves = sum(1 for _, _, d in decisions if target.vector_lanes_f32 // 2 in (d.data_block, d.out_block))
    if decisions and HALF_BLOCK_MIN <= target.vector_lanes_f32 // 2:
        conv_part += (f"; {halves} convs read or write half-vector blocks ({target.vector_lanes_f32 // 2} lanes)"
                      if half else "; half-vector blocks off in the spec (half_blocks)")
    summary = f"{note}{conv_part}; {mm_part}; candidates scored {how}; {search.conversions.note()}"
    return converted, PassReport("layout", "applied", summary, {
        "convs": len(decisions), "packed": len(packed), "conversions_before": 2 * len(packed),
        "conversions_after": act, "constants_relaid": const, "clip_ops_rewritten": clips, "batchnorms_decomposed": bns,
        "splits_as_sections": splits,
        "constants_full_rank": promoted,
        "lookahead": {"convs": len(ahead), "changed": changed}, "shared_by_class": shared,
        "pooling": {"convs": len(pooled), "changed": pool_changed}, "padded_outputs": len(padded), "half_blocks": halves,
        "runoff": {"decisions": len(runoff), "changed": runoff_changed}, "conversion_charges": search.conversions.counts,
        "padding_slices": slices, "padding_flowed": flowed, "padding_extra_groups": extra,
        "matmuls": len(matmuls), "matmuls_packed": n_panels, "per_conv": _conv_details(decisions),
        "per_matmul": [{"a": list(s.a), "n": s.n, "n_t": d.nt, "scores_ms": d.scores, "from_database": d.reused,
                        **({"first_timing_ms": d.runoff} if d.runoff else {})}
                       for _, s, d in matmuls]})
