"""QDQ convs and matmuls on AMX-INT8 tiles (optimize/int8_tiles.py): which take tiles on a target
with AMX-INT8, that the integer module computes what the float one does (exact int32 sums: at
most a requantize flip), and a package built for a Sapphire Rapids target that passes its check
where this machine has the tiles."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from packager.frontend import import_relax, load_model
from packager.optimize import int8_tiles
from packager.optimize.int8 import integer_kernels
from packager.optimize.schedule.rules import tile_dot
from packager.optimize.schedule.rules.int_dot import PAIR, QUAD, TILE
from packager.optimize.schedule.rules.tile_dot import tile_channels
from packager.spec import TargetSpec
from packager.targets import can_run_here, resolve
from support import packrt
from support.helpers import run_pack, save_model, write_spec
import tvm
from tvm import relax

from packager.optimize.constfold import fold_constants
from packager.optimize.relax_util import legalize
from test_int8 import Y_SCALE, _dq_pair, _dq_weight

IN = [1, 64, 9, 9]


def _model() -> onnx.ModelProto:
    """A 3x3 conv 64 -> 32 channels (tiles), a 1x1 conv 32 -> 24 (fewer than 64 input channels:
    quads), and a 20 x 96 -> 48 matmul of a second input (tiles of 10 rows, K padded to 128), each
    requantized."""
    rng = np.random.default_rng(21)
    nodes, inits = [], []
    x = _dq_pair(nodes, inits, "x", "x", 0.04, 128)
    w1 = _dq_weight(nodes, inits, "w1", rng.integers(-127, 128, (32, 64, 3, 3)).astype(np.int8),
                    rng.uniform(0.001, 0.004, 32).astype(np.float32), np.zeros(32, np.int8), axis=0)
    inits.append(numpy_helper.from_array(rng.normal(0, 0.1, 32).astype(np.float32), "b1"))
    nodes.append(helper.make_node("Conv", [x, w1, "b1"], ["c1"], pads=[1, 1, 1, 1]))
    h = _dq_pair(nodes, inits, "h", "c1", 0.1, 100)
    w2 = _dq_weight(nodes, inits, "w2", rng.integers(-127, 128, (24, 32, 1, 1)).astype(np.int8),
                    np.array(0.01, np.float32), np.array(0, np.int8), axis=0)
    nodes.append(helper.make_node("Conv", [h, w2], ["c2"]))
    y = _dq_pair(nodes, inits, "y", "c2", Y_SCALE, 128)
    nodes.append(helper.make_node("Identity", [y], ["out"]))
    r = _dq_pair(nodes, inits, "r", "rows", 0.05, 120)
    w3 = _dq_weight(nodes, inits, "w3", rng.integers(-127, 128, (96, 48)).astype(np.int8),
                    rng.uniform(0.005, 0.02, 48).astype(np.float32), np.zeros(48, np.int8), axis=1)
    nodes.append(helper.make_node("MatMul", [r, w3], ["m"]))
    z = _dq_pair(nodes, inits, "z", "m", Y_SCALE, 128)
    nodes.append(helper.make_node("Identity", [z], ["mout"]))
    graph = helper.make_graph(nodes, "tiles", [helper.make_tensor_value_info("x", TensorProto.FLOAT, IN),
                                               helper.make_tensor_value_info("rows", TensorProto.FLOAT, [20, 96])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 24, 9, 9]),
                               helper.make_tensor_value_info("mout", TensorProto.FLOAT, [20, 48])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def _run(mod: tvm.IRModule, *inputs: np.ndarray) -> list[np.ndarray]:
    vm = relax.VirtualMachine(tvm.compile(legalize(fold_constants(mod)[0]), target="llvm"), tvm.cpu())
    return [o.numpy() for o in vm["main"](*(tvm.runtime.tensor(x) for x in inputs))]


def test_fit():
    assert int8_tiles.unfit(64, 32, 9) == "" and int8_tiles.unfit(96, 48, 20) == ""
    assert int8_tiles.unfit(32, 32, 9) == "input channels below 64, not a multiple of 64"
    assert int8_tiles.unfit(64, 24, 9) == "output channels not a multiple of 16"
    assert int8_tiles.unfit(64, 32, 17) == "positions per row with no divisor from 4 to 16"
    assert tile_channels("u8s8", 96) == 128 and tile_channels("u8s8", 64) == 64 and tile_channels("bf16", 96) == 96


def test_tiles_take_what_fits_and_compute_what_the_float_path_does(tmp_path):
    mod = import_relax(load_model(save_model(_model(), tmp_path / "t.onnx")), {"x": tuple(IN), "rows": (20, 96)},
                       {"x": "float32", "rows": "float32"})[0]
    out, report = integer_kernels(mod, (TILE, QUAD, PAIR))
    assert report.details["groups"] == {"64": 2, "4": 1} and "2 as AMX-INT8 tiles (tdpbusd)" in report.summary
    tiles = [f for gv, f in out.functions.items() if gv.name_hint.startswith("tile_dot_int8")]
    assert len(tiles) == 2 and {tile_dot.of(f).kind for f in tiles} == {"u8s8"}
    rng = np.random.default_rng(22)
    x, rows = rng.normal(0, 2, IN).astype(np.float32), rng.normal(0, 2, (20, 96)).astype(np.float32)
    want, got = _run(mod, x, rows), _run(out, x, rows)
    for w, g in zip(want, got):
        steps = np.abs(w - g) / Y_SCALE
        assert w.std() > 10 * Y_SCALE and steps.max() <= 1.0 + 1e-4 and (steps > 0.5).mean() <= 0.02


def test_a_sapphire_rapids_package_runs_tiles_and_passes_its_check(tmp_path):
    spec_target = {"kind": "cpu", "arch": "x86_64", "mcpu": "sapphirerapids"}
    if not can_run_here(resolve(TargetSpec("spr", spec_target, "test"))) or not tile_dot.request_amx():
        pytest.skip("this machine has no AMX-INT8 (or Linux refused its tile state)")
    model = save_model(_model(), tmp_path / "t.onnx")
    out = tmp_path / "pkg"
    spec = write_spec(tmp_path, f"name: tiles\nmodel: {model}\noutput: {out}\ninputs:\n"
                      f"  x: {{dtype: float32, shape: {IN}}}\n  rows: {{dtype: float32, shape: [20, 96]}}\n"
                      "targets:\n  - {name: spr, kind: cpu, arch: x86_64, mcpu: sapphirerapids}\n")
    r = run_pack("build", spec)
    assert r.returncode == 0, r.stderr
    report = json.loads((out / "build_report.json").read_text())
    passes = {p["pass"]: p for p in report["targets"][0]["kernel_passes"]}
    assert passes["int8"]["details"]["groups"] == {"64": 2, "4": 1}
    assert "2 amx" in passes["schedule"]["summary"]
    assert "tdpbusd" in packrt.run(["objdump", "-d", out / "targets/spr/kernels.so"]).stdout
    check = packrt.run(packrt.cli(out) + [out, "--check"])
    assert check.returncode == 0 and " ok " in check.stdout, check.stdout + check.stderr
