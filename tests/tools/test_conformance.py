"""ONNX backend node tests through the packager: no case that passed may regress, and every
operator the packager claims passes at least 95% of the cases that run."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from support.helpers import REPO
from packager.tools import conformance as conf
from packager.frontend.model import SUPPORTED_OPS

EXPECTED = REPO / "tests" / "conformance_expected.json"


@pytest.mark.slow
def test_node_tests_do_not_regress_and_claimed_ops_pass():
    expected = conf.load_expected(EXPECTED)
    assert expected, f"{EXPECTED} is missing: run pack conformance --expected ... --update-expected"
    cases = conf.collect()
    results = conf.run([c.name for c in cases], jobs=2)
    regressed = [f"{r.name}: {r.status} ({r.detail})" for r in results
                 if expected.get(r.name) == "pass" and r.status != "pass"]
    assert not regressed, "\n".join(regressed)
    for op, counts in conf.per_op(results).items():
        rate = conf.pass_rate(counts)
        if op != conf.COMPOSITE and rate is not None:
            assert op in SUPPORTED_OPS and rate >= 0.95, (op, counts)


def test_cases_outside_the_opset_range_are_moved_into_it():
    """prepare() relabels a case written at opset 24 to 21 and one at 6 to 11 (Relu means the same)."""
    node = helper.make_node("Relu", ["x"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    for written, moved in ((24, 21), (6, 11)):
        case = SimpleNamespace(model=helper.make_model(g, opset_imports=[helper.make_opsetid("", written)]),
                               data_sets=[([np.ones(2, np.float32)], [np.ones(2, np.float32)])])
        prepared = conf.prepare(case)
        assert not isinstance(prepared, str), prepared
        assert prepared[0].opset_import[0].version == moved


def test_static_operands_become_initializers():
    cases = {c.name: c for c in conf.collect({"Reshape"})}
    model, feeds, expected = conf.prepare(cases["test_reshape_reduced_dims"])
    assert list(feeds) == ["data"]                       # 'shape' moved into the model
    assert [i.name for i in model.graph.initializer] == ["shape"]
    assert expected[0].shape == (2, 12)
    assert isinstance(feeds["data"], np.ndarray)
    assert onnx.checker.check_model(model) is None


def test_a_case_where_onnxruntime_misses_the_expected_output_like_us_is_told_apart():
    """'differs' only when onnxruntime misses ONNX's expected output and we compute what it does;
    an output that also differs from onnxruntime is a failure."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    case = SimpleNamespace(rtol=1e-5, atol=1e-6)
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    relu = np.maximum(x, 0)
    wrong_expectation = [relu + 1]
    assert conf._mismatch(model, [relu], wrong_expectation, case)
    assert conf._onnxruntime_agrees(model, {"x": x}, [relu], wrong_expectation, case)
    assert not conf._onnxruntime_agrees(model, {"x": x}, [relu * 2], wrong_expectation, case)
    assert not conf._onnxruntime_agrees(model, {"x": x}, [relu], [relu], case)     # onnxruntime is right
