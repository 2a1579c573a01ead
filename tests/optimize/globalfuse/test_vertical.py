"""Vertical fusion (vertical.py): which kernels are layout copies that may fold into their neighbours."""
from __future__ import annotations

import tvm
from tvm import relax, te

from packager.optimize.globalfuse.vertical import is_layout_only
from support.kernel_cases import CASES, kernels_of


def test_layout_only_means_a_plain_copy():
    assert all(is_layout_only(f) for f in kernels_of(CASES["transpose"]).values())
    for name in ("matmul_odd", "add_broadcast", "softmax_last", "conv3x3"):
        assert not any(is_layout_only(f) for f in kernels_of(CASES[name]).values()), name
    x = relax.Var("x", relax.TensorType((10, 4), "float32"))
    i = relax.Var("i", relax.TensorType((3,), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, i]):
        out = bb.emit(relax.op.take(x, i, axis=0))
        bb.emit_func_output(out)
    gather = relax.transform.LegalizeOps()(bb.get())
    prim = next(f for _, f in gather.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    assert not is_layout_only(prim)                               # a gather reads data-dependent indices



def _prim(build) -> tvm.tirx.PrimFunc:
    x = te.placeholder((4, 8), "float32", name="x")
    return te.create_prim_func([x, te.compute((4, 8) if build != "transpose" else (8, 4), {
        "cast": lambda i, j: x[i, j].astype("float16"),
        "transpose": lambda i, j: x[j, i].astype("float16"),
        "exp": lambda i, j: te.exp(x[i, j]).astype("float16"),
        "scale": lambda i, j: x[i, j] * 2.0}[build], name="y")])


def test_a_cast_folds_like_a_copy_but_arithmetic_does_not():
    """fp16 builds cast a layer norm's fp32 output for the matmul reading it; FuseOps leaves the
    cast alone when the residual reads the fp32 value too, so it folds into its readers."""
    assert is_layout_only(_prim("cast")) and is_layout_only(_prim("transpose"))
    assert not is_layout_only(_prim("exp")) and not is_layout_only(_prim("scale"))
