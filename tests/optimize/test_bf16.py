"""bf16 (optimize/bf16.py): convs and matmuls with constant weights become TileDot kernels over
bf16-rounded operands, the ones that do not fit stay float32 with their reason counted, and the
module computes what the float32 one does within bf16's tolerance (the TileDot reference loops
run on any CPU)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, te

from packager.frontend import import_relax, load_model
from packager.optimize.bf16 import bf16_bits, bf16_numpy, tile_dots
from packager.optimize.constfold import fold_constants
from packager.optimize.relax_util import legalize
from packager.spec.model import PRECISION_TOLERANCE
from packager.tools.verify import compare
from support.helpers import ort_run, save_model

F = TensorProto.FLOAT


def _model() -> onnx.ModelProto:
    """A 3-channel stem conv (kept: padding 3 channels to 32 would multiply zeros), a stride-2 3x3
    conv, a 1x1 conv, a matmul of 2048 -> 64 and a 10-class head (kept: 10 outputs are no panel)."""
    rng = np.random.default_rng(0)
    inits = {"w0": rng.normal(0, 0.3, (32, 3, 3, 3)), "w1": rng.normal(0, 0.1, (64, 32, 3, 3)),
             "w2": rng.normal(0, 0.1, (32, 64, 1, 1)), "m": rng.normal(0, 0.05, (32 * 8 * 8, 64)),
             "h": rng.normal(0, 0.2, (64, 10))}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()]
    inits.append(numpy_helper.from_array(np.array([1, -1], np.int64), "shape"))
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1] * 4), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1] * 4, strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]), helper.make_node("Conv", ["r1", "w2"], ["c2"]),
             helper.make_node("Reshape", ["c2", "shape"], ["f"]), helper.make_node("MatMul", ["f", "m"], ["d"]),
             helper.make_node("Relu", ["d"], ["r2"]), helper.make_node("MatMul", ["r2", "h"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", F, [1, 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(legalize(fold_constants(mod)[0]), target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_convs_and_matmuls_compute_in_bf16_within_its_tolerance(tmp_path):
    path = save_model(_model(), tmp_path / "m.onnx")
    x = np.random.default_rng(1).normal(0, 1, (1, 3, 16, 16)).astype(np.float32)
    mod = import_relax(load_model(Path(path)), {"x": x.shape}, {"x": "float32"})
    mod = mod[0] if isinstance(mod, tuple) else mod
    out, report = tile_dots(mod)
    assert (report.details["convs"], report.details["matmuls"]) == (2, 1)
    assert report.details["kept"] == {"input channels below 64, not a multiple of 32": 1,
                                      "output channels not a multiple of 16": 1}
    assert "bf16: 2 conv(s) and 1 matmul(s)" in report.summary
    kernels = [f for f in out.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert sum("packager.tile_dot" in (f.attrs or {}) for f in kernels) == 3
    got, want = _run(out, x), ort_run(path, {"x": x})["y"]
    rtol, atol = PRECISION_TOLERANCE["bf16"]
    max_abs, _, ok, _ = compare(got, want, rtol, atol)
    assert ok, max_abs
    assert not np.array_equal(got, _run(mod, x))         # bf16 really ran


def test_rounding_to_bf16_is_to_nearest_even_in_kernels_and_in_numpy():
    ties = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20], np.float32)   # down, up, above the tie
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 3.4e38, 1e-40], np.float32)
    values = np.concatenate([ties, special, np.random.default_rng(2).standard_normal(64).astype(np.float32)])
    bits = bf16_numpy(values)
    back = (bits.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(back[:3], np.array([1, 1 + 2**-6, 1 + 2**-7], np.float32))
    assert np.isnan(back[5]) and np.isinf(back[3:5]).all() and np.signbit(back[7]) and back[9] > 0
    x = te.placeholder((values.size,), "float32", "x")
    f = te.create_prim_func([x, te.compute(x.shape, lambda i: bf16_bits(x[i]), name="bits")])
    lib = tvm.compile(tvm.IRModule({"main": f}), target="llvm")
    out = tvm.runtime.tensor(np.zeros(values.size, np.uint16))
    lib["main"](tvm.runtime.tensor(values), out)
    np.testing.assert_array_equal(out.numpy(), bits)


def test_a_matmul_of_prime_rows_is_padded_to_whole_tiles(tmp_path):
    """197 rows (ViT's tokens) have no tile height from 4 to 16: 208 rows are computed, 197 kept."""
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.1, (64, 32)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", F, [1, 197, 64])],
                          [helper.make_tensor_value_info("y", F, [1, 197, 32])], [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    x = rng.standard_normal((1, 197, 64)).astype(np.float32)
    mod = import_relax(load_model(Path(save_model(m, tmp_path / "m.onnx"))), {"x": x.shape},
                       {"x": "float32"})
    out, report = tile_dots(mod[0] if isinstance(mod, tuple) else mod)
    assert report.details["matmuls"] == 1 and not report.details["kept"]
    assert [t.px for t in _tile_dots(out)] == [208]
    np.testing.assert_allclose(_run(out, x), x @ w, rtol=2e-2, atol=2e-2)


def _tile_dots(mod: tvm.IRModule) -> list:
    from packager.optimize.schedule.contract import TileDot
    return [TileDot.from_json(str(f.attrs["packager.tile_dot"])) for f in mod.functions.values()
            if isinstance(f, tvm.tirx.PrimFunc) and "packager.tile_dot" in (f.attrs or {})]
