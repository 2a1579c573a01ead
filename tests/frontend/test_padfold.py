"""Zero Pads folded into the Conv reading them: same outputs in onnxruntime, and only the pads
that qualify (constant mode, zero value, spatial axes, every reader a Conv) are folded."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T, helper, numpy_helper as nh

from packager.frontend.padfold import fold_pads_into_convs
from support.helpers import ort_run


def _model() -> onnx.ModelProto:
    """TF-style SAME padding before a stride-2 conv (asymmetric), a pad of value 1 before a conv,
    a zero pad read by a conv and a Relu, and a pad on the channel axis."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    def pads(name, v):
        return nh.from_array(np.array(v, np.int64), name)
    nodes = [helper.make_node("Pad", ["x", "same"], ["xp"]),
             helper.make_node("Conv", ["xp", "w"], ["a"], strides=[2, 2], pads=[0, 1, 0, 0]),
             helper.make_node("Pad", ["x", "sym", "one"], ["xo"]),
             helper.make_node("Conv", ["xo", "w"], ["b"]),
             helper.make_node("Pad", ["x", "sym"], ["xs"]),
             helper.make_node("Conv", ["xs", "w"], ["c"]),
             helper.make_node("Relu", ["xs"], ["d"]),
             helper.make_node("Pad", ["x", "chan"], ["xc"]),
             helper.make_node("Conv", ["xc", "w5"], ["e"])]
    inits = [pads("same", [0, 0, 0, 0, 0, 0, 1, 1]), pads("sym", [0, 0, 1, 1, 0, 0, 1, 1]),
             pads("chan", [0, 1, 0, 0, 0, 1, 0, 0]), nh.from_array(np.array(1.0, np.float32), "one"),
             nh.from_array(w, "w"), nh.from_array(rng.standard_normal((4, 5, 1, 1)).astype(np.float32), "w5")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])], [], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    shapes = {"a": [1, 4, 3, 5], "b": [1, 4, 8, 8], "c": [1, 4, 8, 8], "d": [1, 3, 10, 10], "e": [1, 4, 8, 8]}
    del m.graph.output[:]
    m.graph.output.extend(helper.make_tensor_value_info(n, T.FLOAT, s) for n, s in shapes.items())
    return m


def test_zero_pads_fold_into_convs_with_the_same_outputs(tmp_path):
    m = _model()
    folded = onnx.ModelProto()
    folded.CopyFrom(m)
    assert fold_pads_into_convs(folded, 17) == 1
    assert [n.op_type for n in folded.graph.node] == ["Conv", "Pad", "Conv", "Pad", "Conv", "Relu", "Pad", "Conv"]
    conv = folded.graph.node[0]
    assert conv.input[0] == "x" and list(helper.get_attribute_value(conv.attribute[-1])) == [0, 1, 1, 1]
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    onnx.save(m, str(tmp_path / "a.onnx"))
    onnx.save(folded, str(tmp_path / "b.onnx"))
    want, got = ort_run(tmp_path / "a.onnx", {"x": x}), ort_run(tmp_path / "b.onnx", {"x": x})
    for k in "abcde":
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)


def test_the_import_folds_only_with_the_simplify_switch(tmp_path):
    from pathlib import Path

    from packager.frontend import import_relax, load_model
    from packager.optimize.relax_util import count_ops
    onnx.save(_model(), str(tmp_path / "m.onnx"))
    m = load_model(Path(tmp_path / "m.onnx"))
    on, stats_on = import_relax(m, {"x": (1, 3, 8, 8)}, {"x": "float32"}, simplify=True)
    off, stats_off = import_relax(m, {"x": (1, 3, 8, 8)}, {"x": "float32"})
    assert (stats_on.pads_folded, stats_off.pads_folded) == (1, 0)
    assert count_ops(on)["relax.call_tir"] == count_ops(off)["relax.call_tir"] - 1     # one pad kernel fewer
