"""optimize/variadic.py: ONNX's variadic Max/Min/Sum/Mean become chains of binary ops (no stack),
with onnxruntime's values, broadcasting included."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from packager.frontend import import_relax, load_model
from packager.optimize.relax_util import legalize
from packager.optimize.variadic import variadic_to_binary
from support.helpers import ort_run, save_model

F = TensorProto.FLOAT


def _model():
    c = numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(4, 1, 1), "c")
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Sum", ["x", "r", "c"], ["sum3"]), helper.make_node("Sum", ["x", "r"], ["sum2"]),
             helper.make_node("Mean", ["x", "r", "c"], ["mean3"]), helper.make_node("Max", ["x", "c"], ["max2"])]
    outs = ["sum3", "sum2", "mean3", "max2"]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4, 3, 5])],
                          [helper.make_tensor_value_info(o, F, [1, 4, 3, 5]) for o in outs], [c])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_stacked_reductions_become_binary_chains_with_onnxruntimes_values(tmp_path):
    path = save_model(_model(), tmp_path / "m.onnx")
    mod = import_relax(load_model(Path(path)), {"x": (1, 4, 3, 5)}, {"x": "float32"})[0]
    assert "R.stack(" in mod.script()
    mod = variadic_to_binary(mod)
    text = mod.script()
    assert "R.stack(" not in text and "R.sum(" not in text and "R.mean(" not in text
    assert text.count("R.add(") == 5 and text.count("R.divide(") == 1
    x = np.random.default_rng(0).standard_normal((1, 4, 3, 5)).astype(np.float32)
    want = ort_run(path, {"x": x})
    vm = relax.VirtualMachine(tvm.compile(legalize(mod), target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x))
    for k, name in enumerate(want):
        np.testing.assert_allclose(got[k].numpy(), want[name], rtol=1e-6, atol=1e-6, err_msg=name)
