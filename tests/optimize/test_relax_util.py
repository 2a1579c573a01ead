"""Gathers (relax.take) in legalization: constant indices checked once instead of per element, and
row gathers fused with the arithmetic around them."""
from __future__ import annotations

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from packager.optimize.relax_util import INJECTIVE, OPAQUE, legalize, prim_funcs
from support.globalfuse_cases import run_module
from support.kernel_cases import optimized_module


def _takes(indices, axis: int, shape=(2, 3, 5, 6)):
    """Legalized PrimFuncs of take(x, indices, axis), indices a constant or (None) an input."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    params = [x]
    if indices is None:
        params.append(relax.Var("i", relax.TensorType((4,), "int64")))
    with bb.function("main", params):
        idx = params[1] if indices is None else relax.const(np.array(indices, np.int64))
        bb.emit_func_output(bb.emit(relax.op.take(x, idx, axis=axis)))
    mod = legalize(bb.get())
    return [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]


def _uses_remainders(func) -> bool:
    return "truncmod" in func.script()


def test_constant_indices_in_range_need_no_index_math_and_rows_are_injective():
    (take,) = _takes([0, -1, 2, 4], axis=2)
    assert not _uses_remainders(take)
    assert int(take.attrs["op_pattern"]) == INJECTIVE


def test_gathers_along_the_last_axis_stay_opaque():
    (take,) = _takes([0, -1, 2, 4], axis=3)
    assert not _uses_remainders(take) and int(take.attrs["op_pattern"]) == OPAQUE


def test_out_of_range_or_run_time_indices_wrap():
    for indices in ([0, 1, 5, 2], None):
        (take,) = _takes(indices, axis=2)
        assert _uses_remainders(take) and int(take.attrs["op_pattern"]) == OPAQUE


def test_a_row_gather_and_its_weighted_sum_are_one_kernel_with_the_same_values():
    """A bilinear row upsample (two gathers, two weights, a sum) with negative indices."""
    rng = np.random.default_rng(0)
    i0, i1 = np.array([0, 0, 1, -3, 2, -1]), np.array([1, -3, 2, 3, -1, 3])
    w0 = rng.random((6, 1)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["x", "i0"], ["g0"], axis=2), helper.make_node("Gather", ["x", "i1"], ["g1"], axis=2),
             helper.make_node("Mul", ["g0", "w0"], ["m0"]), helper.make_node("Mul", ["g1", "w1"], ["m1"]),
             helper.make_node("Add", ["m0", "m1"], ["y"])]
    inits = {"i0": i0, "i1": i1, "w0": w0, "w1": 1 - w0}
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, n) for n, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    mod = optimized_module(m, fusion=True)
    assert [n for n in prim_funcs(mod)] == ["fused_take_take_multiply_multiply_add"]
    x = rng.standard_normal((1, 3, 4, 8)).astype(np.float32)
    want = x[:, :, i0 % 4] * w0 + x[:, :, i1 % 4] * (1 - w0)
    np.testing.assert_allclose(run_module(mod, x), want, rtol=1e-6)
