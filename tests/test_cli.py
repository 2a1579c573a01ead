"""`pack` as a user meets it: bad input gives one clear line, exit code 2, no traceback, no output."""
from __future__ import annotations

import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from support.helpers import assert_clean_error, run_pack, save_model, write_spec

SPEC = """\
name: m
model: model.onnx
inputs:
  x: {dtype: float32, shape: [2, 4]}
targets: [x86-64]
"""
STRICT = "onnxruntime: {fallback: false}\n"     # unsupported ops are an error instead of partial offload


def tiny_model(op_nodes=None, inputs=None, opset=17) -> onnx.ModelProto:
    nodes = op_nodes or [helper.make_node("Relu", ["x"], ["y"], name="relu0")]
    g = helper.make_graph(nodes, "g", inputs or [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def no_output_left(folder):
    return not (folder / "dist").exists() or not any((folder / "dist").iterdir())


def test_malformed_onnx(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07this is not a protobuf at all" * 10)
    r = run_pack("build", write_spec(tmp_path, SPEC))
    assert_clean_error(r, 2, "model.onnx", "not a readable ONNX model")
    assert no_output_left(tmp_path)


def test_unsupported_ops_listed_in_one_error(tmp_path):
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nz_a"),
             helper.make_node("Relu", ["x"], ["r"], name="ok_relu"),
             helper.make_node("NonZero", ["r"], ["nz2"], name="nz_b"),
             helper.make_node("Hardmax", ["x"], ["v"], name="hardmax_1", axis=1),
             helper.make_node("Frobnicate", ["x"], ["y"], name="custom_1", domain="com.example")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                          [onnx.numpy_helper.from_array(np.array([2], np.int64), "k")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "model.onnx"))
    r = run_pack("build", write_spec(tmp_path, SPEC + STRICT))
    assert_clean_error(r, 2, "unsupported operator(s)", "NonZero (nodes: nz_a, nz_b)", "Hardmax (nodes: hardmax_1)",
                       "com.example.Frobnicate (nodes: custom_1)")
    assert no_output_left(tmp_path)


def test_unsupported_ops_without_custom_domain(tmp_path):
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nz_a"),
             helper.make_node("Hardmax", ["x"], ["v"], name="hardmax_1", axis=1),
             helper.make_node("Relu", ["x"], ["y"], name="ok")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                          [onnx.numpy_helper.from_array(np.array([2], np.int64), "k")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "model.onnx"))
    r = run_pack("build", write_spec(tmp_path, SPEC + STRICT))
    assert_clean_error(r, 2, "unsupported operator(s)", "NonZero (nodes: nz_a)", "Hardmax (nodes: hardmax_1)")


def test_opset_onnxruntime_does_not_run(tmp_path):
    save_model(tiny_model(opset=5), tmp_path / "model.onnx")
    assert_clean_error(run_pack("build", write_spec(tmp_path, SPEC)), 2, "opset 5", "not one onnxruntime runs (7-")


def test_spec_typo(tmp_path):
    save_model(tiny_model(), tmp_path / "model.onnx")
    r = run_pack("build", write_spec(tmp_path, SPEC.replace("targets:", "target:")))
    assert_clean_error(r, 2, "spec.yaml:5", "unknown key 'target'", "did you mean 'targets'")


def test_unbound_dynamic_dim(tmp_path):
    save_model(tiny_model(inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])]),
               tmp_path / "model.onnx")
    r = run_pack("build", write_spec(tmp_path, "name: m\nmodel: model.onnx\ntargets: [x86-64]\n"))
    assert_clean_error(r, 2, "input 'x' has dynamic dims ['batch']", "bind them")
    assert no_output_left(tmp_path)


def test_shape_disagrees_with_model(tmp_path):
    save_model(tiny_model(), tmp_path / "model.onnx")
    r = run_pack("build", write_spec(tmp_path, SPEC.replace("[2, 4]", "[3, 4]")))
    assert_clean_error(r, 2, "inputs.x.shape", "dim 0 of 'x' is fixed to 2 in the model")


def test_inputs_sharing_a_dim_name_must_agree(tmp_path):
    nodes = [helper.make_node("Add", ["x", "z"], ["y"], name="add0")]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4]) for n in ("x", "z")]
    save_model(tiny_model(nodes, inputs), tmp_path / "model.onnx")
    spec = SPEC.replace("shape: [2, 4]}\n", "shape: [2, 4]}\n  z: {dtype: float32, shape: [3, 4]}\n")
    r = run_pack("build", write_spec(tmp_path, spec))
    assert_clean_error(r, 2, "inputs.z.shape", "dynamic dim 'batch' is 3 here but 2 for x", "must agree")
    assert no_output_left(tmp_path)


def test_missing_model_file(tmp_path):
    r = run_pack("build", write_spec(tmp_path, SPEC))
    assert_clean_error(r, 2, "model file not found")


def test_a_model_path_that_is_a_folder_or_a_fifo_says_so(tmp_path):
    (tmp_path / "model.onnx").mkdir()
    assert_clean_error(run_pack("build", write_spec(tmp_path, SPEC)), 2, "model.onnx is a folder, not an ONNX file")
    (tmp_path / "model.onnx").rmdir()
    os.mkfifo(tmp_path / "model.onnx")
    assert_clean_error(run_pack("build", write_spec(tmp_path, SPEC)), 2, "not a regular file (a FIFO")


def test_checker_errors_keep_the_node_they_name(tmp_path):
    save_model(tiny_model([helper.make_node("Relu", ["x"], ["y"], name="relu_7", foo=3)]), tmp_path / "model.onnx")
    assert_clean_error(run_pack("build", write_spec(tmp_path, SPEC)), 2, "Unrecognized attribute: foo for operator Relu",
                       "Name: relu_7 OpType: Relu")


def test_a_graph_without_outputs_is_refused(tmp_path):
    m = tiny_model()
    del m.graph.output[:]
    save_model(m, tmp_path / "model.onnx")
    assert_clean_error(run_pack("build", write_spec(tmp_path, SPEC)), 2, "the graph has no outputs")


def test_an_operator_onnxruntime_does_not_know_either_is_refused_with_partial_offload(tmp_path):
    """With partial offload the node would stay in onnxruntime, whose wrapper model then cannot load."""
    m = tiny_model([helper.make_node("Relu", ["x"], ["t"], name="relu0"),
                    helper.make_node("Frobnicate", ["t"], ["y"], name="custom_1", domain="com.example")])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    save_model(m, tmp_path / "model.onnx")
    assert_clean_error(run_pack("build", write_spec(tmp_path, SPEC)), 2,
                       "neither the packager nor onnxruntime implements com.example.Frobnicate (nodes: custom_1)")
    assert no_output_left(tmp_path)


def test_a_conv_whose_kernel_shape_contradicts_its_weights_is_refused(tmp_path):
    w = onnx.numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv_big", kernel_shape=[2 ** 40, 3])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    save_model(m, tmp_path / "model.onnx")
    spec = SPEC.replace("x: {dtype: float32, shape: [2, 4]}", "x: {dtype: float32, shape: [1, 2, 8, 8]}")
    assert_clean_error(run_pack("build", write_spec(tmp_path, spec)), 2,
                       "node conv_big (Conv) has kernel_shape [1099511627776, 3], but its weights 'w' are [4, 2, 3, 3]")


def test_unknown_target(tmp_path):
    save_model(tiny_model(), tmp_path / "model.onnx")
    r = run_pack("build", write_spec(tmp_path, SPEC.replace("[x86-64]", "[x86-65]")))
    assert_clean_error(r, 2, "targets[0]", "unknown target 'x86-65'")


def test_gpu_target_without_nvcc_is_a_clear_error(tmp_path):
    """Neither the nvidia-cuda-nvcc wheel nor a CUDA toolkit on PATH: one line saying what to pip install."""
    import os
    import subprocess
    import sys

    save_model(tiny_model(), tmp_path / "model.onnx")
    spec = write_spec(tmp_path, SPEC.replace("[x86-64]", "[x86-64, a100]"))
    env = dict(os.environ, PATH="/usr/bin:/bin")          # the CUDA toolkit lives in /usr/local
    hide_wheel = ("import packager.codegen.cuda_toolchain as t; t._wheel_bin = lambda: None; "
                  "from packager.cli import main; main()")
    r = subprocess.run([sys.executable, "-c", hide_wheel, "build", str(spec)], capture_output=True, text=True,
                       env=env)
    assert_clean_error(r, 2, "'nvcc' not found", "pip install nvidia-cuda-nvcc==13.0.88")
    assert no_output_left(tmp_path)


def test_target_flag_must_name_a_spec_target(tmp_path):
    save_model(tiny_model(), tmp_path / "model.onnx")
    r = run_pack("build", write_spec(tmp_path, SPEC), "--target", "arm64")
    assert_clean_error(r, 2, "--target arm64", "its targets: x86-64")


def test_output_folder_that_is_not_a_package_is_not_replaced(tmp_path):
    save_model(tiny_model(), tmp_path / "model.onnx")
    (tmp_path / "dist" / "m").mkdir(parents=True)
    (tmp_path / "dist" / "m" / "precious.txt").write_text("user data")
    r = run_pack("build", write_spec(tmp_path, SPEC))
    assert_clean_error(r, 2, "exists and is not a package")
    assert (tmp_path / "dist" / "m" / "precious.txt").read_text() == "user data"


@pytest.mark.slow
def test_a_package_folder_holding_user_files_is_not_replaced(tmp_path):
    save_model(tiny_model(), tmp_path / "model.onnx")
    spec = write_spec(tmp_path, SPEC)
    assert run_pack("build", spec).returncode == 0
    (tmp_path / "dist" / "m" / "targets" / "notes.txt").write_text("user data")
    r = run_pack("build", spec)
    assert_clean_error(r, 2, "holds targets/notes.txt, which is not part of the package there")
    assert (tmp_path / "dist" / "m" / "targets" / "notes.txt").read_text() == "user data"
    (tmp_path / "dist" / "m" / "targets" / "notes.txt").unlink()
    (tmp_path / "dist" / "m" / "bench.json").write_text("{}")     # as `pack bench` leaves it
    assert run_pack("build", spec).returncode == 0         # report.html, ort/model.onnx, bench.json are the packager's
    assert not (tmp_path / "dist" / "m" / "bench.json").exists()  # results of the old build are not kept


def test_output_under_a_file_is_one_line(tmp_path):
    save_model(tiny_model(), tmp_path / "model.onnx")
    (tmp_path / "a_file").write_text("x")
    r = run_pack("build", write_spec(tmp_path, SPEC), "--output", str(tmp_path / "a_file" / "pkg"))
    assert_clean_error(r, 2, "a_file is a file, not a folder")


@pytest.mark.slow
def test_failed_build_leaves_nothing_and_keeps_the_old_package(tmp_path, monkeypatch):
    from packager import build as build_mod
    from packager.emit import assemble
    from packager.errors import InternalError
    from packager.spec import load_spec

    save_model(tiny_model(), tmp_path / "model.onnx")
    spec = load_spec(write_spec(tmp_path, SPEC))
    first = build_mod.build(spec, log=lambda _m: None)
    before = (first / "manifest.json").read_text()

    def boom(*_a, **_k):
        raise InternalError("simulated failure while writing the package")

    monkeypatch.setattr(assemble, "package_readme", boom)
    with pytest.raises(InternalError):
        build_mod.build(spec, log=lambda _m: None)
    assert (first / "manifest.json").read_text() == before
    assert sorted(p.name for p in (tmp_path / "dist").iterdir()) == ["m"]   # no .partial folder left


def test_debug_flag_shows_traceback(tmp_path):
    r = run_pack("--debug", "build", tmp_path / "missing.yaml")
    assert r.returncode == 2 and "Traceback" in r.stderr


def test_inspect_and_verify_reject_non_packages(tmp_path):
    assert_clean_error(run_pack("inspect", tmp_path), 2, "not a package")
    assert_clean_error(run_pack("verify", tmp_path), 2, "not a package")


@pytest.mark.slow
def test_build_then_inspect(tmp_path):
    save_model(tiny_model(), tmp_path / "model.onnx")
    r = run_pack("build", write_spec(tmp_path, SPEC))
    assert r.returncode == 0, r.stderr
    assert "pass schedule [x86-64]: applied" in r.stdout
    assert "pass derive [x86-64]: applied: no ConvTranspose or Conv in the model" in r.stdout
    where = next(ln for ln in r.stdout.splitlines() if ln.startswith("  where the time went (s): "))
    assert all(stage in where for stage in ("check spec and model", "import + graph passes", "x86-64 ", "report.html"))
    assert where.index("x86-64 ") < where.index("report.html")    # in the order the build ran them
    r = run_pack("inspect", tmp_path / "dist" / "m")
    assert r.returncode == 0, r.stderr
    assert "all sizes and checksums match" in r.stdout
    shutil.copy(tmp_path / "model.onnx", tmp_path / "dist" / "m" / "targets" / "x86-64" / "weights.bin")
    r = run_pack("inspect", tmp_path / "dist" / "m")
    assert r.returncode == 1 and "weights.bin" in r.stdout


def test_shape_operands_from_input_data_are_rejected_naming_the_node(tmp_path):
    nodes = [helper.make_node("Reshape", ["x", "shape_in"], ["y"], name="reshape_dyn")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                                       helper.make_tensor_value_info("shape_in", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "model.onnx"))
    spec = SPEC.replace("  x: {dtype: float32, shape: [2, 4]}\n", "  x: {shape: [2, 4]}\n  shape_in: {shape: [2]}\n")
    r = run_pack("build", write_spec(tmp_path, spec + STRICT))
    assert_clean_error(r, 2, "node reshape_dyn (Reshape) takes input #1 'shape_in'", "make that operand a constant")


def test_training_mode_is_rejected(tmp_path):
    f = TensorProto.FLOAT
    stats = [onnx.numpy_helper.from_array(np.ones(4, np.float32), n) for n in ("s", "b", "m", "v")]
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn_train", training_mode=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [2, 4])],
                          [helper.make_tensor_value_info("y", f, [2, 4])], stats)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "model.onnx"))
    assert_clean_error(run_pack("build", write_spec(tmp_path, SPEC + STRICT)), 2, "bn_train", "training mode")
    # by default the node would stay in ONNX Runtime; alone in the model, that leaves nothing to compile
    assert_clean_error(run_pack("build", write_spec(tmp_path, SPEC)), 2, "nothing left to compile",
                       "bn_train (BatchNormalization): is in training mode")
