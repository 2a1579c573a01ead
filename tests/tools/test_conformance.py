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
