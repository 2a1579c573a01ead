"""Applying the chosen conv layouts with TVM's ConvertLayout, and what happens when it refuses:
the same choices with one block for every packed tensor, the op that refuses isolated (lowered
to a kernel with NCHW around it), the convs it silently left NCHW accepted when that measures
faster than the fallback, uniform blocking, and at last NCHW everywhere. One op must not cost
the whole model its layouts."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import tvm
from tvm import relax

from ..ieee import LEGALIZATIONS as IEEE_OPS
from ..relax_util import rewrite_functions
from .isolate import isolate
from .pad import is_plain_conv, op_name
from .search import Decision
from .sites import ConvSite


def bindings(mod: tvm.IRModule):
    for block in mod["main"].body.blocks:
        yield from block.bindings


@relax.expr_functor.mutator
class _UnshareWeights(relax.PyExprMutator):
    """Gives every conv a weight constant of its own."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.seen: list = []
        self.copied = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not is_plain_conv(call):
            return call
        w = call.args[1]
        if any(w.same_as(s) for s in self.seen):
            self.copied += 1
            w = relax.const(w.value.numpy().copy(), str(w.value.dtype))
            call = relax.Call(call.op, [call.args[0], w], call.attrs, call.ty_args)
        self.seen.append(w)
        return call


def unshare_conv_weights(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """Convs that read one weight constant (the ONNX zoo's "light" models share identical
    weights, which the importer merges) each get a copy: the layout callback finds a conv's
    choice by its weight, and two convs may choose different layouts (each packs its own copy)."""
    m = _UnshareWeights(mod)
    out = rewrite_functions(m, mod)
    return (out, m.copied) if m.copied else (mod, 0)


def _layouts_applied(mod: tvm.IRModule) -> Counter:
    return Counter((b.value.attrs.data_layout, b.value.attrs.kernel_layout, b.value.attrs.out_layout)
                   for b in bindings(mod) if op_name(b.value) == "relax.nn.conv2d")


def _callback(decisions):
    """ConvertLayout's layout callback: each conv's chosen layouts (found by its weight)."""
    def layout_cb(call):
        if op_name(call) != "relax.nn.conv2d":
            return {}
        for w, _, d in decisions:
            if call.args[1].same_as(w):
                return {"relax.nn.conv2d": list(d.layouts())}
        return {"relax.nn.conv2d": ["NCHW", "OIHW", "NCHW"]}

    return layout_cb


def _convert(mod: tvm.IRModule, decisions) -> tuple[tvm.IRModule | None, str]:
    """ConvertLayout with each conv's chosen layouts, then merged and dropped conversions; (None,
    why) when TVM raises (it cannot express a conversion, e.g. NCHW16c -> NCHW32c)."""
    try:
        return tvm.transform.Sequential([
            relax.transform.ConvertLayout({}, layout_cb=_callback(decisions)),
            relax.transform.EliminateCommonSubexpr(),
            relax.transform.DeadCodeElimination(),
        ])(mod), ""
    except Exception as e:  # noqa: BLE001 - TVM raises InternalError for layouts it cannot convert
        return None, str(e).strip().splitlines()[-1][:160]


def _apply(mod: tvm.IRModule, decisions) -> tuple[tvm.IRModule | None, str]:
    """_convert, and (None, why) also when TVM applied other layouts than the chosen ones."""
    converted, why = _convert(mod, decisions)
    if converted is None:
        return None, why
    applied = _layouts_applied(converted)
    want = Counter(d.layouts() for _, _, d in decisions)
    if applied != want:
        return None, f"applied {dict(applied)}, wanted {dict(want)}"
    return converted, ""


def _one_block(site: ConvSite, lanes: int, d: Decision | None = None) -> Decision:
    """Every packed tensor at `lanes` where its channels allow, NCHW otherwise: the only
    conversions left are packed <-> NCHW, which TVM can always express. With `d` (a searched
    decision), its choice of packed or NCHW per tensor is kept, and its scores with it; without,
    every tensor is packed (the uniform fallback)."""
    data = lanes if (d is None or d.data_block > 1) and site.channels % lanes == 0 else 1
    out = lanes if (d is None or d.out_block > 1) and site.valid(data, lanes) else 1
    w_in, w_out = site.weight_blocks(data, out)
    return replace(d, data_block=data, out_block=out, w_in=w_in, w_out=w_out) if d is not None \
        else Decision(data, out, w_in, w_out)


def apply_conv_layouts(mod: tvm.IRModule, decisions, lanes: int) -> tuple[tvm.IRModule, list, str]:
    """Apply the searched conv layouts; if TVM refuses them, the same with one block for every
    packed tensor, then the searched layouts with what refuses them isolated, then the
    vector-width block for all; else NCHW. An op whose own layout inference fails (even with
    every conv at NCHW), or fails beside the searched layouts (a Split of a packed conv's output:
    nudenet's seven C2f blocks cost its 64 searched convs their choices), or one that still fails
    under uniform blocking, is lowered to a kernel first with NCHW around it (isolate.py), so one
    op does not cost the whole model its layouts."""
    if not any((d.data_block, d.out_block) != (1, 1) for _, _, d in decisions):
        return mod, decisions, ""
    plain = [(w, s, Decision(1, 1, 1, 1, d.scores)) for w, s, d in decisions]
    converted, why = _apply(mod, decisions)
    if converted is not None:
        return converted, decisions, ""
    mod, note = _isolated(mod, plain, "")             # checked only once the choices were refused
    if note:
        converted, why = _apply(mod, decisions)
        if converted is not None:
            return converted, decisions, note
    one = [(w, s, _one_block(s, lanes, d)) for w, s, d in decisions]
    if [d for *_, d in one] != [d for *_, d in decisions]:   # 16c meeting 32c, which TVM cannot convert
        converted, _ = _apply(mod, one)
        if converted is not None:
            return converted, one, note + (f"searched layouts refused by ConvertLayout ({why}): the searched "
                                           f"packed/NCHW choices kept, every packed block {lanes} lanes; ")
    searched, searched_note = _isolated(mod, decisions, note)   # an op that fails only beside packed
    if searched_note != note:                                   # convs (YOLO's channel Split)
        converted, _ = _apply(searched, decisions)
        if converted is not None:
            return converted, decisions, searched_note
    uniform = [(w, s, _one_block(s, lanes)) for w, s, _ in decisions]
    partial = _partially_applied(searched, decisions, uniform)
    if partial is not None:
        converted, kept, lost = partial
        return converted, kept, searched_note + (f"searched layouts refused by ConvertLayout for {lost} conv(s) "
                                                 f"({why}), which stay NCHW: the searched choices of the others "
                                                 f"kept, their measured total below uniform {lanes}-lane blocking's; ")
    refused = f"searched layouts refused by ConvertLayout ({why}): uniform {lanes}-lane blocking used; "
    converted, why2 = _apply(mod, uniform)
    if converted is None:
        mod, note = _isolated(mod, uniform, note)
        converted, why2 = _apply(mod, uniform)
    if converted is not None:
        return converted, uniform, note + refused
    return mod, plain, f"{note}NCHW kept: ConvertLayout refused the searched layouts ({why}) and uniform blocking ({why2}); "


def _partially_applied(mod: tvm.IRModule, decisions, uniform) -> tuple[tvm.IRModule, list, int] | None:
    """ConvertLayout with the searched choices, where it left some convs NCHW without failing
    (shufflenet: 2 of 49 wanted packed), kept when the scores of what it applied sum below those
    of uniform blocking (which would pack the 47 grouped convs the search left NCHW): (module,
    the decisions as applied, convs that lost their choice), else None. Needs every conv scored."""
    converted, _ = _convert(mod, decisions)
    if converted is None or not all(d.scores for *_, d in decisions):
        return None
    plain = _plain_conv_weights(converted)
    applied = [(w, s, d if (d.data_block, d.out_block) == (1, 1) or not any(w.same_as(p) for p in plain)
                else replace(d, data_block=1, out_block=1, w_in=1, w_out=1)) for w, s, d in decisions]
    if Counter(d.layouts() for *_, d in applied) != _layouts_applied(converted):
        return None                                       # not only "left NCHW": something else happened
    cost = [_score(d0, a) for (*_, d0), (*_, a) in zip(decisions, applied)]
    fallback = [_score(d0, u) for (*_, d0), (*_, u) in zip(decisions, uniform)]
    if sum(cost) > sum(fallback):
        return None
    lost = sum(a is not d for (*_, a), (*_, d) in zip(applied, decisions))
    return converted, applied, lost


def _score(searched: Decision, d: Decision) -> float:
    """The searched conv's score (ms) for the blocks of `d`; its slowest candidate's if that pair
    was not scored."""
    return searched.scores.get(f"{d.data_block}/{d.out_block}", max(searched.scores.values()))


def _plain_conv_weights(mod: tvm.IRModule) -> list:
    """The constant weights of the convs ConvertLayout left at NCHW / OIHW / NCHW."""
    return [b.value.args[1] for b in bindings(mod) if is_plain_conv(b.value)]


def _isolated(mod: tvm.IRModule, chosen, note: str) -> tuple[tvm.IRModule, str]:
    """`mod` with the op types lowered that keep ConvertLayout from applying `chosen` (unchanged
    when it applies, or when lowering does not help), and the report note saying which."""
    converted, why = _apply(mod, chosen)
    if converted is not None:
        return mod, note
    lowered_mod, lowered = isolate(mod, lambda m: _apply(m, chosen)[0] is not None, IEEE_OPS)
    if lowered_mod is None:
        return mod, note
    return lowered_mod, note + (f"{', '.join(lowered)} lowered to kernels before layout conversion, NCHW around "
                                f"them (TVM cannot infer their layouts: {why}); ")
