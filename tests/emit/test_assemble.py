"""The package's bookkeeping (emit/assemble.py): package ids, the compiled unit the emitters read,
and the reference data written per unit."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np

from packager.emit.assemble import Build, CompiledUnit, package_id, write_units
from packager.emit.package import PackageWriter
from packager.emit.reference import REFERENCE_FILE, References, UnitReference
from packager.spec import OptimizeSpec, VerifySpec


def _spec(tmp_path, raw=None, precision=None):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"not parsed here")
    return SimpleNamespace(name="m", model=model, raw=raw or {"name": "m"}, verify=VerifySpec(rtol=1e-4, atol=1e-5),
                           optimize=OptimizeSpec(precision=precision or {}))


def test_a_package_id_names_one_build_of_one_part(tmp_path):
    spec = _spec(tmp_path)
    whole = package_id(spec, "abc")
    assert whole == package_id(spec, "abc") and len(whole) == 16
    assert len({whole, package_id(spec, "abc", "p0"), package_id(spec, "abd"),
                package_id(_spec(tmp_path, {"name": "m", "targets": ["arm64"]}), "abc")}) == 4


def test_a_compiled_unit_reads_as_its_unit():
    unit = SimpleNamespace(name="p0", rel="parts/p0", model="M", profiles=[("default", {})], dtypes={"x": "float32"})
    cu = CompiledUnit(unit, {"default": "G"}, [], {}, [{"name": "x86-64"}])
    assert (cu.name, cu.rel, cu.model, cu.profiles, cu.dtypes) == ("p0", "parts/p0", "M", unit.profiles, unit.dtypes)


def test_the_whole_models_reference_is_written_and_no_part_is_pinned(tmp_path):
    spec = _spec(tmp_path)
    ref = UnitReference("", [("default", {"x": np.ones((2, 2), np.float32)}, {"y": np.zeros(3, np.float32)})])
    build = Build(spec, None, {}, [], None, [], References([ref], 28))
    unit = CompiledUnit(SimpleNamespace(name="", rel=""), {}, [], {}, [])
    with PackageWriter(tmp_path / "pkg") as w:
        pins = write_units(w, build, [unit])
        stored = json.loads(w.path(REFERENCE_FILE).read_text())
        assert pins == {} and stored["rtol"] == 1e-4 and [p["name"] for p in stored["profiles"]] == ["default"]
        w.abort()


def test_a_reduced_precision_target_gets_its_own_tolerance_in_the_reference(tmp_path):
    """packrt-run --check and the GPU suite read it: an fp16 target is held to fp16's tolerance,
    the fp32 targets beside it to the spec's."""
    spec = _spec(tmp_path, precision={"h100": "fp16"})
    ref = UnitReference("", [("default", {"x": np.ones((2, 2), np.float32)}, {"y": np.zeros(3, np.float32)})])
    build = Build(spec, None, {}, [SimpleNamespace(name="h100"), SimpleNamespace(name="x86-64")], None, [],
                  References([ref], 28))
    with PackageWriter(tmp_path / "pkg") as w:
        write_units(w, build, [CompiledUnit(SimpleNamespace(name="", rel=""), {}, [], {}, [])])
        stored = json.loads(w.path(REFERENCE_FILE).read_text())
        w.abort()
    assert (stored["rtol"], stored["atol"]) == (1e-4, 1e-5)
    assert stored["targets"] == {"h100": {"rtol": 1e-2, "atol": 1e-3, "precision": "fp16"}}
