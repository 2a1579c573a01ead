"""The memory a profile needs, estimated before compiling (frontend/sizes.py): bound inputs that
cannot fit this machine, or a small input that shape inference shows growing into a tensor that
cannot, are refused in one line naming the tensor; ordinary models pass."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from packager.errors import UserError
from packager.frontend import bind_profiles, load_model
from packager.frontend import sizes
from packager.spec import load_spec
from support.helpers import assert_clean_error, run_pack, save_model, write_spec

F = TensorProto.FLOAT


def _relu(dim) -> object:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", F, [dim, 1024])],
                          [helper.make_tensor_value_info("y", F, [dim, 1024])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _grows() -> object:
    """x [1, 64] -> Expand to [4096, 4096] -> ReduceSum -> [1, 4096]: 64 MiB in the middle."""
    shape = numpy_helper.from_array(np.array([4096, 4096], np.int64), "shape")
    nodes = [helper.make_node("Expand", ["x", "shape"], ["wide"]),
             helper.make_node("ReduceSum", ["wide"], ["y"], keepdims=1, axes=[0])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 1])],
                          [helper.make_tensor_value_info("y", F, [1, 4096])], [shape])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])
    m.ir_version = 8
    return m


def _check(tmp_path, model, inputs: str = "") -> None:
    save_model(model, tmp_path / "model.onnx")
    spec = load_spec(write_spec(tmp_path, f"name: m\nmodel: model.onnx\n{inputs}targets: [x86-64]\n"))
    loaded = load_model(spec.model)
    sizes.check_sizes(spec, loaded, bind_profiles(spec, loaded))


def test_a_batch_of_a_billion_is_refused_before_compiling(tmp_path):
    with pytest.raises(UserError, match=r"profile 'default' needs at least 3.73 TiB \(inputs 3.73 TiB \(x: 3.73 TiB\)"
                                        r".*bind smaller shapes"):
        _check(tmp_path, _relu("N"), "inputs:\n  x: {dtype: float32, shape: [1000000000, 1024]}\n")


def test_an_intermediate_that_cannot_fit_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(sizes, "host_memory", lambda: 32 << 20)
    with pytest.raises(UserError, match=r"the largest intermediate tensor 64.00 MiB \('wide'\)"):
        _check(tmp_path, _grows())


def test_ordinary_shapes_pass(tmp_path):
    _check(tmp_path, _relu("N"), "inputs:\n  x: {dtype: float32, shape: [8, 1024]}\n")
    _check(tmp_path, _grows())


def test_pack_build_refuses_it_in_one_line(tmp_path):
    save_model(_relu("N"), tmp_path / "model.onnx")
    spec = write_spec(tmp_path, "name: m\nmodel: model.onnx\ninputs:\n  x: {dtype: float32, shape: [1000000000, 1024]}\n"
                                "targets: [x86-64]\n")
    assert_clean_error(run_pack("build", spec), 2, "needs at least", "bind smaller shapes")
    assert not (tmp_path / "dist").exists()
