"""Reduced precision (`optimize.precision`): a target's convs and matmuls compute in fp16 with
fp32 accumulation, their weights are stored in fp16, and the tensors between kernels are fp16
wherever the ops around them allow it.

TVM's ToMixedPrecision does the rewriting: an op it always converts (conv, matmul) gets fp16
operands and an fp32 accumulator (`out_dtype`), an op that follows computes in the type of its
inputs, an op it never converts (softmax, reductions) gets fp32. Numerically sensitive ops that
would follow are pinned to fp32 here for the duration of the pass: the spec's keep list
(`optimize.keep_fp32`, ONNX op types; DEFAULT_KEEP_FP32 without one). The casts it inserts on
constant weights fold to fp16 constants (constfold.py), and the other casts fuse into the
kernels around them (FuseOps). Which devices can run which precision is the target's
(Target.precisions); this pass only rewrites the graph it is given. TVM's rewrite takes tensor
operands only: call_tir calls are wrapped for it (below) and Clip with scalar bounds becomes
maximum/minimum first (layout/clip.py, as legalization does anyway).
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import tvm
from tvm import relax

from ..errors import UserError
from ..spec.model import KEEP_FP32_OPS
from .base import PassReport
from .layout.clip import clip_as_ops
from .relax_util import rewrite_functions

# The ONNX op types the keep list may name (spec.model.KEEP_FP32_OPS) -> the Relax ops they import
# as (all "follow" in TVM: without a pin they would compute in fp16 behind an fp16 producer).
KEEPABLE: dict[str, tuple[str, ...]] = {
    "LayerNormalization": ("relax.nn.layer_norm",), "GroupNormalization": ("relax.nn.group_norm",),
    "InstanceNormalization": ("relax.nn.instance_norm",), "RMSNormalization": ("relax.nn.rms_norm",),
    "Exp": ("relax.exp",), "Log": ("relax.log",), "Pow": ("relax.power",), "Sqrt": ("relax.sqrt", "relax.rsqrt"),
    "Erf": ("relax.erf",), "Tanh": ("relax.tanh",), "Sigmoid": ("relax.sigmoid",), "Div": ("relax.divide",),
    "Gelu": ("relax.nn.gelu", "relax.nn.gelu_tanh"), "AveragePool": ("relax.nn.avg_pool2d",),
    "GlobalAveragePool": ("relax.nn.adaptive_avg_pool2d",),
}
assert set(KEEPABLE) == set(KEEP_FP32_OPS)
# Softmax, LogSoftmax, the reductions and an unfolded BatchNormalization are always fp32: TVM has
# no fp16 rule for them.
_POLICY = "TMixedPrecisionPolicy"
_NEVER = 2                                     # TVM's MixedPrecisionPolicyKind::kNever
_COMPUTE = {"relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.nn.conv2d_transpose", "relax.matmul",
            "relax.nn.attention", "relax.linear"}


@contextmanager
def _pinned(ops: list[str]) -> Iterator[None]:
    """The Relax ops `ops` count as never-converted while the block runs (TVM's op attribute
    table is global: the old policy is put back, also on error)."""
    saved = []
    try:
        for name in ops:
            op = tvm.ir.Op.get(name)
            saved.append((op, op.get_attr(_POLICY)))
            op.reset_attr(_POLICY)
            op.set_attr(_POLICY, _NEVER)
        yield
    finally:
        for op, old in saved:
            op.reset_attr(_POLICY)
            if old is not None:
                op.set_attr(_POLICY, old)


def to_precision(mod: tvm.IRModule, precision: str, keep: tuple[str, ...]) -> tuple[tvm.IRModule, PassReport]:
    """The module with convs and matmuls in `precision` (fp32 accumulation), `keep` pinned to fp32."""
    if precision == "fp32":
        return mod, PassReport("precision", "applied", "fp32 for this target (optimize.precision)",
                               {"precision": "fp32"})
    if precision != "fp16":
        raise ValueError(f"precision {precision!r}: only fp16 is rewritten by this pass")
    pinned = [name for op_type in keep for name in KEEPABLE[op_type]]
    hidden, calls = _hide_tir_calls(relax.transform.ConvertToDataflow()(clip_as_ops(mod)[0]))
    with _pinned(pinned):
        try:
            rewritten = relax.transform.ToMixedPrecision(out_dtype="float32")(hidden)
        except Exception as e:  # noqa: BLE001 - TVM's pass raises internal errors of many kinds
            raise UserError(f"optimize.precision {precision}: TVM's mixed-precision rewrite failed on this model "
                            f"({str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}); build "
                            "this target at fp32 (optimize.precision: {<target>: fp32})") from None
        out = _restore_tir_calls(rewritten, calls)
    counts = _op_dtypes(out)
    low = sum(n for (op, dt), n in counts.items() if op in _COMPUTE and dt == "float16")
    high = sum(n for (op, dt), n in counts.items() if op in _COMPUTE and dt != "float16")
    kept = Counter({op.removeprefix("relax."): n for (op, dt), n in counts.items()
                    if op not in _COMPUTE and dt == "float32" and op != "relax.astype"})
    kept_text = ", ".join(f"{op} {n}" for op, n in sorted(kept.items(), key=lambda kv: -kv[1])[:8])
    return out, PassReport(
        "precision", "applied",
        f"fp16: {low} conv/matmul ops with fp16 operands and fp32 accumulation"
        + (f", {high} left fp32" if high else "") + f"; fp32 ops: {kept_text or 'none'} "
        f"(keep list: {', '.join(keep) or 'empty'})",
        {"precision": precision, "fp16_compute_ops": low, "fp32_compute_ops": high, "fp32_ops": dict(kept),
         "keep_fp32": list(keep)})


def _tir_calls(mod: tvm.IRModule) -> list[relax.Call]:
    calls: list[relax.Call] = []
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(
                func, lambda e: calls.append(e) if isinstance(e, relax.Call) and getattr(e.op, "name", "") ==
                "relax.call_tir" else None)
    return calls


def _key(call: relax.Call) -> str:
    return f"{call.args[0].name_hint}|{[str(a.ty) for a in call.args[1].fields]}|{call.ty}"


def _outputs(call: relax.Call):
    """A call_tir's output type as call_tir takes it (a list for several outputs: the recurrent loops)."""
    return list(call.ty.fields) if isinstance(call.ty, relax.TupleType) else call.ty


def _hide_tir_calls(mod: tvm.IRModule) -> tuple[tvm.IRModule, dict[str, relax.Call]]:
    """Every call_tir (TE the importer lowered: Pad, Tile, the recurrent loops) as a call of a Relax
    function wrapping it. TVM 0.27's ToMixedPrecision fails on call_tir (it reads the PrimFunc
    operand as a tensor); a Relax function call it keeps in fp32, as the PrimFunc requires."""
    bb, calls, names = relax.BlockBuilder(mod), {}, {}
    for call in _tir_calls(mod):
        if _key(call) in names:
            continue
        params = [relax.Var(f"a{i}", a.ty) for i, a in enumerate(call.args[1].fields)]
        with bb.function(f"__fp32_tir_{len(names)}", params, {"Primitive": False}):
            bb.emit_func_output(bb.emit(relax.call_tir(call.args[0], params, _outputs(call))))
        names[_key(call)] = f"__fp32_tir_{len(names)}"
        calls[names[_key(call)]] = call
    if not names:
        return mod, {}
    out = bb.get()
    gvs = {name: out.get_global_var(name) for name in calls}

    @relax.expr_functor.mutator
    class Hide(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if getattr(call.op, "name", None) == "relax.call_tir" and _key(call) in names:
                return relax.Call(gvs[names[_key(call)]], list(call.args[1].fields))
            return call

    hide = Hide(out)
    for gv, func in out.functions_items():
        if isinstance(func, relax.Function) and gv.name_hint not in calls:   # not the wrappers themselves
            hide.builder_.update_func(gv, hide.visit_expr(func))
    return hide.builder_.get(), calls


def _restore_tir_calls(mod: tvm.IRModule, calls: dict[str, relax.Call]) -> tvm.IRModule:
    """The wrapped call_tir calls back in place; the wrappers leave the module."""
    if not calls:
        return mod

    @relax.expr_functor.mutator
    class Restore(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if isinstance(call.op, tvm.ir.GlobalVar) and call.op.name_hint in calls:
                original = calls[call.op.name_hint]
                return relax.call_tir(original.args[0], list(call.args), _outputs(original))
            return call

    out = rewrite_functions(Restore(mod), mod)
    return tvm.IRModule({gv: f for gv, f in out.functions.items() if gv.name_hint not in calls}, attrs=out.attrs)


def _op_dtypes(mod: tvm.IRModule) -> Counter:
    """(op name, dtype its first tensor operand has) -> count, over the Relax functions."""
    counts: Counter = Counter()

    def visit(e) -> None:
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.args:
            ty = getattr(e.args[0], "ty", None)
            if isinstance(ty, relax.TensorType):
                counts[(e.op.name, str(ty.dtype))] += 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts
