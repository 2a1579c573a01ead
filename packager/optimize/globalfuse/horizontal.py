"""Horizontal fusion: sibling matmuls that read the same tensor (the separate Q/K/V projections
Hugging Face exports, sibling linear layers) become one matmul on weights concatenated at build
time, so the shared input is read once and the combined N gives the GEMM wider panels.

TVM's CombineParallelMatmul does the rewrite but only for weights that are function
parameters; the importer embeds weights as constants. So the constants are lifted to
parameters, combined, bound back and folded (the concat is computed here, not at run time).
Runs on the graph before layout packing, so the combined weight is packed once. Sibling 1x1
convs (Inception branches) are not combined: TVM 0.27 has no CombineParallelConv2D.
"""
from __future__ import annotations

import tvm
from tvm import relax


MAX_COMBINED_N = 16384        # beyond this the combined weight stops fitting any panel scheme


def combine_siblings(mod: tvm.IRModule, ctx) -> tuple[tvm.IRModule, None]:
    """Returns the module with sibling matmuls combined; leaves what it did in ctx.notes."""
    ctx.notes["horizontal"] = {"groups": 0, "matmuls": 0, "conv_groups_left": _sibling_convs(mod["main"])}
    lifted, main = _lift_weights(mod["main"])
    if lifted is None:
        return mod, None
    mod = mod.clone()                      # the caller's module is shared (other targets, profiles)
    mod.update_func(mod.get_global_var("main"), main)
    mod = relax.transform.Normalize()(mod)   # the rebuilt calls get their types (LeViT: some lacked them)
    taken: list[int] = []

    def check(lhs, rhs_list, bias_list, bindings) -> bool:
        shapes = [tuple(int(d) for d in r.ty.shape) for r in rhs_list]
        ok = (len(rhs_list) >= 2 and all(r in lifted for r in rhs_list) and all(b in lifted for b in bias_list)
              and len({str(r.ty.dtype) for r in rhs_list}) == 1
              and all(len(sh) == 2 for sh in shapes) and sum(sh[1] for sh in shapes) <= MAX_COMBINED_N)
        if ok:
            taken.append(len(rhs_list))
        return ok

    mod = relax.transform.CombineParallelMatmul(check)(mod)
    mod = tvm.transform.Sequential([
        relax.transform.BindParams("main", dict(lifted)),
        relax.transform.FoldConstant(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(),
    ])(mod)
    ctx.notes["horizontal"].update(groups=len(taken), matmuls=sum(taken))
    return mod, None


def _sibling_convs(main: relax.Function) -> int:
    """Groups of two or more convs reading one tensor (Inception branches, a ResNet block's 1x1
    and downsample): reported as left apart."""
    readers: dict = {}
    body = main.body
    for block in getattr(body, "blocks", []):
        for b in block.bindings:
            if _op(b.value) == "relax.nn.conv2d":
                readers[b.value.args[0]] = readers.get(b.value.args[0], 0) + 1
    return sum(1 for n in readers.values() if n >= 2)


def _lift_weights(main: relax.Function) -> tuple[dict | None, relax.Function]:
    """main with each constant matmul weight (and the constant bias added to that matmul's
    result) as a parameter; ({param: value}, the function), or (None, main) when no two matmuls
    with constant weights share an input."""
    body = main.body
    if not isinstance(body, relax.SeqExpr) or len(body.blocks) != 1:
        return None, main
    bindings = list(body.blocks[0].bindings)
    lhs_count: dict = {}
    for b in bindings:
        if _op(b.value) == "relax.matmul" and _is_const(b.value.args[1]):
            lhs_count[b.value.args[0]] = lhs_count.get(b.value.args[0], 0) + 1
    if max(lhs_count.values(), default=0) < 2:
        return None, main
    lifted: dict = {}
    results = set()
    new_bindings = []
    for b in bindings:
        v, op = b.value, _op(b.value)
        if op == "relax.matmul" and _is_const(v.args[1]):
            w = _param(lifted, v.args[1])
            v = relax.op.matmul(v.args[0], w, out_dtype=v.attrs.out_dtype)
            results.add(b.var)
        elif op == "relax.add" and any(a in results for a in v.args) and any(_is_const(a) for a in v.args):
            # result first: the combiner's pattern is matmul + bias (exporters also write bias + matmul)
            mm, bias = (v.args[0], v.args[1]) if _is_const(v.args[1]) else (v.args[1], v.args[0])
            v = relax.op.add(mm, _param(lifted, bias))
        new_bindings.append(relax.VarBinding(b.var, v) if v is not b.value else b)
    new_body = relax.SeqExpr([relax.DataflowBlock(new_bindings)], body.body)
    return lifted, relax.Function(list(main.params) + list(lifted), new_body, main.ret_ty, main.is_pure, main.attrs)


def _param(lifted: dict, const) -> relax.Var:
    var = relax.Var(f"gf_weight{len(lifted)}", const.ty)
    lifted[var] = const.value
    return var


def _op(value) -> str | None:
    return getattr(getattr(value, "op", None), "name", None)


def _is_const(e) -> bool:
    return isinstance(e, tvm.ir.expr.GenericConst)
