"""Relax utilities the graph passes share: run a mutator over every function, legalize graph ops
into PrimFuncs, find constants and PrimFuncs."""
from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.ir import expr as ir
from tvm.ir.expr import TensorLoad   # TVM 0.27's BufferLoad


@relax.expr_functor.mutator
class _SafeTake(relax.PyExprMutator):
    """ONNX Gather becomes relax.take in "fast" mode, which reads out of bounds (and crashes the
    process) on a bad index; "wrap" computes the same for every valid index, negative ones
    included, and stays in bounds for invalid ones. Constant indices are checked here instead:
    in range (negative ones made positive), they keep "fast", whose loads take no index math;
    wrap's two int64 remainders per element made a Resize's gather along the last axis of
    [1, 21, 224, 224] 1.7 ms instead of 0.2."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) == "relax.take" and call.attrs.mode == "fast":
            idx = _in_range_indices(call)
            if idx is not None:
                return relax.op.take(call.args[0], relax.const(idx), call.attrs.axis, mode="fast")
            return relax.op.take(call.args[0], call.args[1], call.attrs.axis, mode="wrap")
        return call


def _in_range_indices(call: relax.Call):
    """A take's constant indices with negative ones made positive, when every one is in range of
    a static axis; None otherwise (indices computed at run time, a dynamic axis, a bad index)."""
    indices, ty = call.args[1], call.args[0].ty
    if not is_const(indices) or getattr(ty, "shape", None) is None:
        return None
    try:
        dims = [int(d) for d in ty.shape.values]
    except (TypeError, AttributeError):
        return None
    axis = call.attrs.axis
    n = int(np.prod(dims)) if axis is None else dims[int(axis) % len(dims)]
    idx = indices.value.numpy()
    if idx.size and not ((idx >= -n) & (idx < n)).all():
        return None
    return np.where(idx < 0, idx + n, idx).astype(idx.dtype)


def rewrite_functions(m: relax.PyExprMutator, mod: tvm.IRModule) -> tvm.IRModule:
    """Run a Relax mutator (constructed over `mod`) on every Relax function of `mod`."""
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            m.builder_.update_func(gv, m.visit_expr(func))
    return m.builder_.get()


def safe_take(mod: tvm.IRModule) -> tvm.IRModule:
    return rewrite_functions(_SafeTake(mod), mod)


def legalize(mod: tvm.IRModule, custom: dict | None = None) -> tvm.IRModule:
    """Graph ops -> PrimFuncs (one per op) and constant folding; no fusion, no schedules.
    `custom` maps op names to our own legalizations (packed-layout convs)."""
    mod = safe_take(mod)
    seq = tvm.transform.Sequential([
        relax.transform.DecomposeOpsForInference(),
        relax.transform.LegalizeOps(custom),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.DeadCodeElimination(),
    ])
    return gathers_injective(seq(mod))


OPAQUE, INJECTIVE = 8, 2        # TVM's OpPatternKind values (kOpaque, kInjective)


def gathers_injective(mod: tvm.IRModule) -> tvm.IRModule:
    """Takes in "fast" mode (in-range constant indices, _SafeTake) along any axis but the last
    marked injective, as Relay had take: TVM's pattern analysis calls every indirect load
    opaque, and FuseOps fuses nothing into or out of an opaque kernel, so a Resize's row gathers
    and its weighted sum were three kernels that each wrote the whole upsampled tensor. A gather
    along the last axis stays opaque: fused, its scalar loads would be recomputed by every
    reader (a bilinear upsample's second axis reads the first axis's result twice per element)."""
    for gv, f in list(mod.functions_items()):
        if (isinstance(f, tirx.PrimFunc) and f.attrs is not None
                and int(f.attrs.get("op_pattern", -1)) == OPAQUE and _fast_row_take(f)):
            mod.update_func(gv, f.with_attr("op_pattern", INJECTIVE))
    return mod


def _fast_row_take(f: tirx.PrimFunc) -> bool:
    """TOPI's take in "fast" mode (one block, T_take, indices without remainders or clamps)
    whose gathered index is not the data's last one."""
    blocks, index_math = [], []
    tvm_ffi.structural_walk(f.body, [(s_tir.SBlock, blocks.append),
                                     ((tirx.FloorMod, tirx.Mod, tirx.Min, tirx.Max), index_math.append)],
                            order="post")
    blocks = [b for b in blocks if b.name_hint != "root"]
    if [b.name_hint for b in blocks] != ["T_take"] or index_math or not isinstance(blocks[0].body, tirx.BufferStore):
        return False
    load = blocks[0].body.value
    return (isinstance(load, TensorLoad) and len(load.indices) > 1
            and not _reads_buffer(load.indices[-1]) and any(_reads_buffer(i) for i in load.indices))


def _reads_buffer(e) -> bool:
    found = []
    tvm_ffi.structural_walk(e, (TensorLoad, found.append), order="post")
    return bool(found)


def prim_funcs(mod: tvm.IRModule) -> dict[str, tvm.tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def bound_value(m: relax.PyExprMutator, e: relax.Expr) -> relax.Expr:
    """What the variable `e` is bound to in the function `m` is rewriting (e itself if it is not
    a bound variable)."""
    bound = m.lookup_binding(e) if isinstance(e, relax.Var) else None
    return e if bound is None else bound


def is_const(e) -> bool:
    return isinstance(e, (ir.GenericConst, ir.Constant)) and hasattr(e, "value") and hasattr(e.value, "numpy")


def count_ops(mod: tvm.IRModule) -> dict[str, int]:
    """Calls per graph op name in `main`."""
    counts: dict[str, int] = {}

    def visit(e):
        if isinstance(e, relax.Call) and hasattr(e.op, "name"):
            counts[e.op.name] = counts.get(e.op.name, 0) + 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return counts
