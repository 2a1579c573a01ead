"""Spec parsing and validation: typed objects out, and errors that name file, line and field."""
from __future__ import annotations

import pytest

from support.helpers import write_spec
from packager.errors import UserError
from packager.spec import load_spec

GOOD = """\
name: cnn
model: model.onnx
inputs:
  image: {dtype: float32, shape: [1, 3, 64, 64]}
profiles:
  - name: batch8
    inputs: {image: {shape: [8, 3, 64, 64]}}
targets:
  - x86-64
  - {name: x86-avx2, kind: cpu, arch: x86-64, isa: avx2}
optimize:
  level: 1
  passes: {fusion: false}
  tuning: {trials: 0, database: ~/db}
verify: {rtol: 1.0e-3, atol: 0}
"""


@pytest.fixture
def spec_dir(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"placeholder")
    return tmp_path


def test_good_spec_becomes_typed_objects(spec_dir):
    spec = load_spec(write_spec(spec_dir, GOOD))
    assert spec.name == "cnn"
    assert spec.model == (spec_dir / "model.onnx").resolve()
    assert spec.output == (spec_dir / "dist" / "cnn").resolve()
    assert spec.inputs["image"].shape == (1, 3, 64, 64)
    assert [p.name for p in spec.profiles] == ["default", "batch8"]
    assert spec.profiles[1].shapes["image"] == (8, 3, 64, 64)
    assert [t.name for t in spec.targets] == ["x86-64", "x86-avx2"]
    assert spec.targets[1].fields == {"kind": "cpu", "arch": "x86-64", "isa": "avx2"}
    assert spec.optimize.enabled("schedule") and not spec.optimize.enabled("fusion")
    assert not spec.optimize.enabled("layout")           # level 1 does not include it
    assert spec.verify.rtol == 1e-3 and spec.verify.atol == 0.0


def test_output_override_is_relative_to_cwd_not_spec(spec_dir, tmp_path):
    spec = load_spec(write_spec(spec_dir, GOOD), output_override=tmp_path / "elsewhere")
    assert spec.output == (tmp_path / "elsewhere").resolve()


@pytest.mark.parametrize("old,new,needles", [
    ("optimize:\n  level: 1", "optimize:\n  levle: 1", ["line 12", "optimize.levle", "did you mean 'level'"]),
    ("targets:", "targetz:", ["unknown key 'targetz'", "did you mean 'targets'"]),
    ("shape: [1, 3, 64, 64]", "shape: [N, 3, 64, 64]", ["inputs.image.shape[0]", "dynamic dimension 'N' is not bound"]),
    ("dtype: float32", "dtype: float33", ["inputs.image.dtype", "unknown dtype 'float33'"]),
    ("model: model.onnx", "model: missing.onnx", ["model", "model file not found"]),
    ("level: 1", "level: 7", ["optimize.level", "expected 0, 1, 2 or 3"]),
    ("{fusion: false}", "{fusion: maybe}", ["optimize.passes.fusion", "expected true or false"]),
    ("{fusion: false}", "{fuse: false}", ["optimize.passes.fuse", "did you mean 'fusion'"]),
    ("trials: 0,", "trials: 0, seconds: -1,", ["optimize.tuning.seconds", "expected a non-negative number"]),
    ("trials: 0,", "trials: 0, seconds: .inf,", ["optimize.tuning.seconds", "expected a non-negative number"]),
    ("trials: 0,", "trials: 0, budget: -3,", ["optimize.tuning.budget", "expected a non-negative number"]),
    ("- name: batch8", "- name: default", ["profiles[0].name", "duplicate profile name"]),
    ("{image: {shape: [8, 3, 64, 64]}}", "{img: {shape: [8, 3, 64, 64]}}", ["profiles[0].inputs.img", "unknown key"]),
    ("rtol: 1.0e-3", "rtol: -1", ["verify.rtol", "expected a number"]),
    ("atol: 0}", "atol: 0, inputs: {image: fast}}", ["verify.inputs.image", "expected a number or a list"]),
    ("atol: 0}", "atol: 0, reference: sometimes}", ["verify.reference", "expected true, false or auto"]),
    ("atol: 0}", "atol: 0, reference: 1}", ["verify.reference", "expected true, false or auto"]),
    ("name: cnn", "name: 'bad name!'", ["name", "package name must match"]),
    ("  - x86-64\n", "  - x86-64\n  - x86-64\n", ["targets[1]", "listed twice"]),
    ("name: cnn\n", "name: cnn\nname: other\n", ["line 2", "name: duplicate key"]),
    ("level: 1", "level: 1\n  precision: fp8", ["optimize.precision", "expected fp32, fp16, bf16"]),
    ("level: 1", "level: 1\n  precision: {h100: fp16}", ["optimize.precision.h100", "not one of the spec's targets",
                                                        "x86-64, x86-avx2"]),
    ("level: 1", "level: 1\n  keep_fp32: [Softmaxx]", ["optimize.keep_fp32[0]", "cannot be kept in fp32 by name",
                                                      "Softmax, the reductions"]),
    ("level: 1", "level: 1\n  keep_fp32: Exp", ["optimize.keep_fp32", "expected a list of ONNX op types"]),
])
def test_spec_errors_name_file_line_and_field(spec_dir, old, new, needles):
    assert old in GOOD
    path = write_spec(spec_dir, GOOD.replace(old, new, 1))
    with pytest.raises(UserError) as e:
        load_spec(path)
    msg = str(e.value).replace(f"{path}:", "line ")
    assert str(path) in str(e.value)
    for n in needles:
        assert n in msg, (n, str(e.value))


def test_missing_required_keys(spec_dir):
    with pytest.raises(UserError, match="missing required key 'targets'"):
        load_spec(write_spec(spec_dir, "name: x\nmodel: model.onnx\n"))


def test_not_yaml(spec_dir):
    with pytest.raises(UserError, match="not valid YAML"):
        load_spec(write_spec(spec_dir, "name: [unclosed\n"))


def test_missing_spec_file(tmp_path):
    with pytest.raises(UserError, match="spec file not found"):
        load_spec(tmp_path / "nope.yaml")


def test_verify_inputs_are_fed_instead_of_random_data(tmp_path):
    """verify.inputs fixes what verify and bench feed an input (a sample rate ORT checks); it must
    name a model input and broadcast to each profile's shape."""
    from onnx import TensorProto, helper

    from packager.frontend import load_model, random_inputs
    from packager.frontend.model import bind_profiles, profile_shapes
    from support.helpers import save_model

    g = helper.make_graph([helper.make_node("Add", ["x", "sr"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
                           helper.make_tensor_value_info("sr", TensorProto.FLOAT, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    save_model(m, tmp_path / "model.onnx")
    text = "name: m\nmodel: model.onnx\ninputs: {x: {shape: [3]}}\ntargets: [x86-64]\nverify: {inputs: VALUES}\n"
    spec = load_spec(write_spec(tmp_path, text.replace("VALUES", "{sr: 16000}")))
    model = load_model(spec.model)
    dtypes = bind_profiles(spec, model)
    feeds = random_inputs(model, profile_shapes(model, spec.profiles[0]), dtypes, values=spec.verify.inputs)
    assert feeds["sr"].shape == () and feeds["sr"] == 16000 and feeds["x"].shape == (3,)
    for values, needle in (("{rate: 1}", "the model has no input 'rate'"), ("{sr: [1, 2]}", "does not broadcast")):
        spec = load_spec(write_spec(tmp_path, text.replace("VALUES", values)))
        with pytest.raises(UserError, match=needle):
            bind_profiles(spec, model)


@pytest.mark.parametrize("old,new,needles", [
    ("name: cnn", "name: \"cnn\\n\"", ["name", "package name must match"]),          # `$` matched before "\n"
    ("model: model.onnx", "model: ~nosuchuser/model.onnx", ["model", "cannot expand '~'", "no such user"]),
    ("model: model.onnx", "model: " + "a" * 300, ["model", "File name too long"]),
    ("rtol: 1.0e-3", "rtol: .nan", ["verify.rtol", "expected a number"]),
    ("rtol: 1.0e-3", "rtol: " + "9" * 400, ["verify.rtol", "expected a number"]),      # float() overflowed
    ("verify: {rtol: 1.0e-3, atol: 0}", "verify: false", ["verify", "expected a mapping"]),  # was: the defaults
    ("shape: [1, 3, 64, 64]", "shape: [1, 3, 64, 99999999999999999999]", ["inputs.image.shape[3]", "integer from 0"]),
    ("isa: avx2", "isa: [avx2]", ["targets[1].isa", "unknown x86 ISA"]),                 # TypeError: unhashable
    ("image:", "\"im\\nage\":", ["profiles[0].inputs.image", "allowed: im\\nage"]),      # not a second line
])
def test_fuzz_findings_are_one_line_user_errors(spec_dir, old, new, needles):
    """Inputs the fuzz tests (test_spec_fuzz.py) found crashing or accepted; each is now a clear error."""
    from packager.targets import resolve_all

    assert old in GOOD
    path = write_spec(spec_dir, GOOD.replace(old, new, 1))
    with pytest.raises(UserError) as e:
        resolve_all(load_spec(path))
    assert "\n" not in str(e.value)
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


@pytest.mark.parametrize("data,needle", [
    (b"name: caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 9)"),
    (b"name: x\x00\n", "not valid YAML: unacceptable character #x0000"),
    (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
    (b"a0: &a0 [x, x, x]\n" + b"".join(b"a%d: &a%d [*a%d, *a%d, *a%d]\n" % (k, k, k - 1, k - 1, k - 1)
                                       for k in range(1, 12)), "more than 100000 entries"),
], ids=["latin1", "nul", "deep", "alias-bomb"])
def test_unreadable_spec_files(spec_dir, data, needle):
    (spec_dir / "spec.yaml").write_bytes(data)
    with pytest.raises(UserError, match=needle.replace("(", r"\(").replace(")", r"\)")) as e:
        load_spec(spec_dir / "spec.yaml")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text, want", [("", "auto"), (", reference: auto", "auto"), (", reference: true", True),
                                        (", reference: false", False)])
def test_verify_reference_is_auto_unless_said(spec_dir, text, want):
    spec = load_spec(write_spec(spec_dir, GOOD.replace("atol: 0}", f"atol: 0{text}}}", 1)))
    assert spec.verify.reference == want


def test_precision_is_per_target_with_a_default(spec_dir):
    """optimize.precision: one value for every target, or target -> precision (fp32 elsewhere);
    keep_fp32 defaults to the normalizations, exp/log/pow and sqrt; a reduced-precision target's
    verify tolerance is widened to what the precision holds, never narrowed."""
    spec = load_spec(write_spec(spec_dir, GOOD.replace("level: 1", "level: 1\n  precision: {x86-avx2: fp16}\n"
                                                       "  keep_fp32: [Exp]")))
    assert spec.optimize.precision_of("x86-avx2") == "fp16" and spec.optimize.precision_of("x86-64") == "fp32"
    assert spec.optimize.reduced() and spec.optimize.keep_fp32 == ("Exp",)
    assert spec.verify.tolerance("fp32") == (1e-3, 0.0)
    assert spec.verify.tolerance("fp16") == (1e-2, 1e-3)
    plain = load_spec(write_spec(spec_dir, GOOD))
    assert not plain.optimize.reduced() and "LayerNormalization" in plain.optimize.keep_fp32
    every = load_spec(write_spec(spec_dir, GOOD.replace("level: 1", "level: 1\n  precision: fp16")))
    assert every.optimize.precision_of("x86-64") == "fp16"


def test_a_precision_the_target_cannot_compute_in_names_the_field(spec_dir):
    """No x86 target computes in fp16 in this version, nor an Arm CPU without FP16 arithmetic: the
    spec's error, before anything is built."""
    from packager.targets import resolve_all

    spec = load_spec(write_spec(spec_dir, GOOD.replace("level: 1", "level: 1\n  precision: {x86-avx2: fp16}")))
    with pytest.raises(UserError) as e:
        resolve_all(spec)
    assert "optimize.precision.x86-avx2" in str(e.value) and "cannot compute in fp16" in str(e.value)
    assert "it takes fp32" in str(e.value)
    gpu = load_spec(write_spec(spec_dir, GOOD.replace("  - x86-64\n", "  - h100\n").replace(
        "level: 1", "level: 1\n  precision: {h100: fp16}")))
    assert [t.precisions for t in resolve_all(gpu)][0] == ("fp32", "fp16")
    v100 = load_spec(write_spec(spec_dir, GOOD.replace("  - x86-64\n", "  - v100\n").replace(
        "level: 1", "level: 1\n  precision: fp16")))
    with pytest.raises(UserError, match="target 'v100' cannot compute in fp16"):
        resolve_all(v100)
    arm = load_spec(write_spec(spec_dir, GOOD.replace("  - x86-64\n", "  - arm64\n").replace(
        "level: 1", "level: 1\n  precision: fp16")))
    with pytest.raises(UserError, match=r"target 'arm64' cannot compute in fp16.*mcpu generic\) has no FP16"):
        resolve_all(arm)
    bf16 = load_spec(write_spec(spec_dir, GOOD.replace("  - x86-64\n", "  - h100\n").replace(
        "level: 1", "level: 1\n  precision: {h100: bf16}")))
    with pytest.raises(UserError, match="cannot compute in bf16"):
        resolve_all(bf16)
