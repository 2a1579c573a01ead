"""Graph simplification (optimize/simplify.py): constant powers of 2 and 3 become multiplies that
compute what onnxruntime computes; other powers stay powers."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from packager.frontend import import_relax, load_model
from packager.optimize.relax_util import count_ops, legalize
from packager.optimize.simplify import simplify
from support.helpers import ort_run, save_model

F = TensorProto.FLOAT


def test_powers_of_two_and_three_become_multiplies(tmp_path):
    exps = {"two": np.array(2.0, np.float32), "three": np.array([3.0], np.float32),
            "half": np.array(2.5, np.float32), "pair": np.array([2.0, 2.0], np.float32)}
    nodes = [helper.make_node("Pow", ["x", name], [f"y_{name}"]) for name in exps]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3, 2])],
                          [helper.make_tensor_value_info(f"y_{n}", F, [3, 2]) for n in exps],
                          [numpy_helper.from_array(v, n) for n, v in exps.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = save_model(m, tmp_path / "m.onnx")
    x = np.array([[1.5, -2.0], [0.0, 3.25], [-0.5, 1e10]], np.float32)
    mod = import_relax(load_model(Path(path)), {"x": (3, 2)}, {"x": "float32"})
    mod = mod[0] if isinstance(mod, tuple) else mod
    out, report = simplify(mod)
    assert report.details["powers_as_multiplies"] == 2
    assert count_ops(out).get("relax.power") == 2                       # 2.5 and the two-element exponent
    vm = relax.VirtualMachine(tvm.compile(legalize(out), target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x))
    want = ort_run(path, {"x": x})
    for k, name in enumerate(want):
        np.testing.assert_allclose(got[k].numpy(), want[name], rtol=1e-6, err_msg=name)
