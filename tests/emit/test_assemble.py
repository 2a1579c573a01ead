"""The package's bookkeeping (emit/assemble.py): package ids, the compiled unit the emitters read,
and the reference data written per unit."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np

from packager.emit.assemble import Build, CompiledUnit, package_id, write_units
from packager.emit.package import PackageWriter
from packager.emit.reference import REFERENCE_FILE, References, UnitReference


def _spec(tmp_path, raw=None):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"not parsed here")
    return SimpleNamespace(name="m", model=model, raw=raw or {"name": "m"}, verify=SimpleNamespace(rtol=1e-4, atol=1e-5))


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
