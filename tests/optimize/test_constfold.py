"""optimize/constfold.py: constants folded with numpy give the values TVM's FoldConstant gives,
bit for bit, and leave nothing for it to compile in a conv + BatchNorm fold."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from packager.frontend import import_relax, load_model
from packager.optimize import constfold
from packager.optimize.relax_util import count_ops
from support.helpers import save_model

F = TensorProto.FLOAT


def _conv_bn(tmp_path: Path) -> tvm.IRModule:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in [
        ("w", rng.standard_normal((8, 3, 3, 3))), ("g", rng.standard_normal(8)),
        ("beta", rng.standard_normal(8)), ("mean", rng.standard_normal(8)), ("var", rng.uniform(0.1, 2, 8)),
        ("s", rng.standard_normal((8, 1, 1)))]]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["n"], epsilon=1e-3),
             helper.make_node("Mul", ["n", "s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 3, 6, 6])],
                          [helper.make_tensor_value_info("y", F, [1, 8, 6, 6])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    path = save_model(m, tmp_path / "m.onnx")
    return import_relax(load_model(Path(path)), {"x": (1, 3, 6, 6)}, {"x": "float32"})[0]


def _constants(mod: tvm.IRModule) -> list[np.ndarray]:
    out = []
    relax.analysis.post_order_visit(mod["main"], lambda e: out.append(e.value.numpy())
                                    if constfold.is_const(e) else None)
    return sorted(out, key=lambda a: (a.shape, a.tobytes()))


def test_numpy_folds_a_batchnorm_fold_to_the_same_bits_as_tvm(tmp_path, monkeypatch):
    mod = relax.transform.FoldBatchnormToConv2D()(_conv_bn(tmp_path))
    assert count_ops(mod).get("relax.sqrt") == 1
    theirs = relax.transform.DeadCodeElimination()(relax.transform.FoldConstant()(mod))
    builds = []
    real = tvm.get_global_func("tirx.build")
    tvm.register_global_func("tirx.build", lambda *a: builds.append(1) or real(*a), override=True)
    try:
        ours, by_numpy = constfold.fold_constants(mod)
    finally:
        tvm.register_global_func("tirx.build", real, override=True)
    assert builds == [] and by_numpy == 8                 # nothing left for FoldConstant to compile
    assert set(count_ops(ours)) == {"relax.nn.conv2d", "relax.add", "relax.multiply"}
    mine, tvms = _constants(ours), _constants(theirs)
    assert len(mine) == len(tvms)
    for a, b in zip(mine, tvms):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_ops_outside_the_table_are_left_to_tvm(tmp_path):
    """exp is not numpy's to fold (TVM's exp is not correctly rounded): FoldConstant folds it, and
    the sqrt and add around it still fold."""
    c = numpy_helper.from_array(np.array([1.0, 4.0, 9.0, 16.0], np.float32), "c")
    nodes = [helper.make_node("Exp", ["c"], ["e"]), helper.make_node("Sqrt", ["c"], ["s"]),
             helper.make_node("Add", ["e", "s"], ["k"]), helper.make_node("Add", ["x", "k"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [4])],
                          [helper.make_tensor_value_info("y", F, [4])], [c])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    path = save_model(m, tmp_path / "m.onnx")
    mod = import_relax(load_model(Path(path)), {"x": (4,)}, {"x": "float32"})[0]
    folded, _ = constfold.fold_constants(mod)
    assert count_ops(folded) == {"relax.add": 1}
    (k,) = _constants(folded)
    np.testing.assert_allclose(k, np.exp([1, 4, 9, 16]) + [1, 2, 3, 4], rtol=1e-6)


def _one_call(make) -> tvm.IRModule:
    """main(x) = x + make(constant), built directly in Relax."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 24, 3, 3)).astype(np.float32)
    w[0, 0, 0, :2] = np.nan
    bb = relax.BlockBuilder()
    folded = bb.normalize(make(relax.const(w)))
    x = relax.Var("x", relax.TensorType([int(d) for d in folded.ty.shape], str(folded.ty.dtype)))
    with bb.function("main", [x]):
        with bb.dataflow():                            # FoldConstant folds only in dataflow blocks
            y = bb.emit_output(relax.op.add(x, folded) if str(folded.ty.dtype) == "float32" else
                               relax.op.logical_or(x, folded))
        bb.emit_func_output(y)
    return bb.get()


def test_packed_weight_layouts_and_isnan_fold_with_numpy_to_tvms_bits():
    """A conv weight's OIHW -> OIHW{i}i{o}o layout_transform and isnan fold without compiling, to
    what FoldConstant computes; a padding map (not a bijection) is left to TVM."""
    makes = [lambda c: relax.op.layout_transform(c, lambda o, i, h, w: (o // 16, i // 8, h, w, i % 8, o % 16)),
             lambda c: relax.op.layout_transform(c, lambda o, i, h, w: (o // 16, i, h, w, tvm.tirx.IntImm("int64", 0), o % 16)),
             lambda c: relax.op.isnan(c)]
    for make in makes:
        mod = _one_call(make)
        theirs = relax.transform.DeadCodeElimination()(relax.transform.FoldConstant()(mod))
        ours, by_numpy = constfold.fold_constants(mod)
        assert by_numpy == 1
        mine, tvms = _constants(ours), _constants(theirs)
        assert len(mine) == len(tvms) == 1 and mine[0].dtype == tvms[0].dtype
        np.testing.assert_array_equal(mine[0], tvms[0])
    padded = _one_call(lambda c: relax.op.layout_transform(c, lambda o, i, h, w: (o // 64, i, h, w, o % 64),
                                                           pad_value=0.0))
    assert constfold.fold_constants(padded)[1] == 0
