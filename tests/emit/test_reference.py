"""reference/ round trip: what write_reference stores, read_reference (and so pack verify and
packrt-run --check) reads back with the same names, dtypes and shapes, scalars included."""
from __future__ import annotations

import numpy as np

from packager.emit.package import PackageWriter
from packager.emit.reference import REFERENCE_FILE, UnitReference, read_reference, write_reference
from packager.spec import VerifySpec


def test_round_trip_keeps_names_dtypes_and_shapes(tmp_path):
    inputs = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "sr": np.array(16000, np.int64)}
    outputs = {"y/0": np.ones((2, 3), np.float32), "flag": np.array(True)}
    with PackageWriter(tmp_path / "pkg") as w:
        write_reference(w, UnitReference("", [("default", inputs, outputs)]), VerifySpec(1e-4, 1e-5), {})
        w.write_manifest({"name": "pkg", "reference": REFERENCE_FILE})
        pkg = w.finish()
    got_in, got_out = read_reference(pkg, {"reference": REFERENCE_FILE})["default"]
    for want, got in ((inputs, got_in), (outputs, got_out)):
        assert list(got) == list(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
            np.testing.assert_array_equal(got[k], want[k])
