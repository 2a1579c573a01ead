"""Models outside opsets 11-21: relabelled or converted, checked against onnxruntime, reported;
negative dims are dynamic."""
from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto, helper

from packager.errors import UserError
from packager.frontend.model import load_model
from packager.frontend.opset import OPSET_MAX, OPSET_MIN, relabel
from support.helpers import run_pack, save_model, write_spec


def _relu(opset: int, shape=(2, 4)) -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def test_newer_opset_is_relabelled_when_every_node_means_the_same(tmp_path):
    loaded = load_model(save_model(_relu(23), tmp_path / "m.onnx"))
    assert loaded.opset == OPSET_MAX and loaded.conversion.how == "relabelled"
    assert loaded.conversion.source == 23


def test_older_opset_goes_through_the_version_converter(tmp_path):
    loaded = load_model(save_model(_relu(9), tmp_path / "m.onnx"))
    assert loaded.opset == OPSET_MIN and loaded.conversion.how == "onnx.version_converter"
    assert load_model(save_model(_relu(13), tmp_path / "n.onnx")).conversion is None


def test_relabel_refuses_an_op_whose_contract_changed():
    m = _relu(22)
    m.graph.node.append(helper.make_node("Split", ["y"], ["a", "b"], axis=1, num_outputs=2))   # num_outputs: 18+
    assert "Split" in relabel(m, 11) and m.opset_import[0].version == 22


def test_opset_outside_what_onnxruntime_runs_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match=r"opset 5 is not one onnxruntime runs"):
        load_model(save_model(_relu(5), tmp_path / "m.onnx"))


def test_negative_dim_is_dynamic(tmp_path):
    m = _relu(17)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    (x,) = load_model(save_model(m, tmp_path / "m.onnx")).inputs
    assert isinstance(x.shape[0], str) and x.shape[1] == 4


def test_question_mark_dims_are_each_their_own_dim(tmp_path):
    """Paddle names every dynamic dim '?': they are unknown, not one shared dim."""
    m = _relu(17, shape=("?", 4))
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "?"
    m.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "?"
    (x,) = load_model(save_model(m, tmp_path / "m.onnx")).inputs
    assert x.shape[0] != x.shape[1] and all(isinstance(d, str) for d in x.shape)
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "batch"
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    (x,) = load_model(save_model(m, tmp_path / "n.onnx")).inputs
    assert x.shape == ("batch", "batch")


def test_a_conversion_that_changes_results_is_an_error(tmp_path, monkeypatch):
    from packager.build import check_inputs
    from packager.spec import load_spec

    real = onnx.version_converter.convert_version

    def wrong(model, target):                    # a converter bug: Relu becomes Sigmoid
        out = real(model, target)
        out.graph.node[0].op_type = "Sigmoid"
        return out

    monkeypatch.setattr(onnx.version_converter, "convert_version", wrong)
    save_model(_relu(9), tmp_path / "model.onnx")
    spec = load_spec(write_spec(tmp_path, "name: m\nmodel: model.onnx\ntargets: [x86-64]\n"))
    with pytest.raises(UserError, match=r"converting opset 9 to 11 \(onnx.version_converter\) changes output 'y'"):
        check_inputs(spec, None)


@pytest.mark.slow
@pytest.mark.parametrize("sample,opset", [("cnn", 9), ("mlp", 7), ("transformer", 23)])
def test_models_outside_the_range_build_and_verify(tmp_path, sample, opset):
    from make_samples import make_cnn, make_mlp, make_transformer

    model = {"cnn": make_cnn, "mlp": make_mlp, "transformer": make_transformer}[sample](opset=opset)
    save_model(model, tmp_path / "model.onnx")
    inputs = "inputs:\n  features: {shape: [3, 256]}\n" if sample == "mlp" else ""
    spec = write_spec(tmp_path, f"name: m\nmodel: model.onnx\n{inputs}targets: [x86-64]\n")
    r = run_pack("build", spec)
    assert r.returncode == 0, r.stderr
    assert f"opset {opset} -> " in r.stdout and "checked against the original in onnxruntime" in r.stdout
    report = json.loads((tmp_path / "dist" / "m" / "build_report.json").read_text())
    assert report["frontend"]["opset"]["source"] == opset and report["frontend"]["opset"]["converted"]
    r = run_pack("verify", tmp_path / "dist" / "m")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_minus_one_dim_is_bound_by_the_spec(tmp_path):
    m = _relu(17, shape=(-1, 4))
    save_model(m, tmp_path / "model.onnx")
    spec = write_spec(tmp_path, "name: m\nmodel: model.onnx\ninputs:\n  x: {shape: [3, 4]}\ntargets: [x86-64]\n")
    r = run_pack("build", spec)
    assert r.returncode == 0, r.stderr
    r = run_pack("verify", tmp_path / "dist" / "m")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_model_without_default_domain_nodes_loads(tmp_path):
    """An ai.onnx.ml-only model (scikit-learn exports) has no default-domain opset: nothing to
    convert; partial offload then says what stays in ONNX Runtime (was 'opset None is not one
    onnxruntime runs')."""
    g = helper.make_graph([helper.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm="L2")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    loaded = load_model(save_model(m, tmp_path / "m.onnx"))
    assert loaded.conversion is None and loaded.opset == OPSET_MAX
