"""int8 QDQ matmuls and convs (optimize/int8.py): which go to integers and which stay in float (by
reason), the packed int8 weights, and that the integer module computes what the float one does
(exact int32 sums: at most a requantize rounding flip, one quantization step)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import tvm
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, te

from packager.frontend import import_relax, load_model
from packager.optimize.constfold import fold_constants
from packager.optimize.int8 import PANEL, int_matmul, integer_kernels, pack_conv, pack_panels
from packager.optimize.schedule.rules.int_dot import PAIR, QUAD
from packager.optimize.relax_util import legalize
from support import packrt
from support.helpers import run_pack, save_model, write_spec
from support.kernel_cases import host_target

M, K, N = 12, 32, 24
Y_SCALE = 0.05


def _dq_pair(nodes, inits, name: str, x: str, scale: float, zp: int, dtype=np.uint8) -> str:
    """x -> QuantizeLinear -> DequantizeLinear (an activation edge of a QDQ model)."""
    inits += [numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
              numpy_helper.from_array(np.array(zp, dtype), f"{name}_z")]
    nodes += [helper.make_node("QuantizeLinear", [x, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
              helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"])]
    return f"{name}_dq"


def _dq_weight(nodes, inits, name: str, q: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int) -> str:
    inits += [numpy_helper.from_array(q, f"{name}_q"), numpy_helper.from_array(scale, f"{name}_s"),
              numpy_helper.from_array(zp, f"{name}_z")]
    nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [name], axis=axis))
    return name


def _model() -> onnx.ModelProto:
    """Four matmuls of a QDQ model: int8 weights per column (MatMul), uint8 weights with a zero
    point per output row (Gemm, transB), a matmul of two activations, a weight of 4 columns (half
    a panel of 8)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    x = _dq_pair(nodes, inits, "x", "x", 0.04, 128)
    w1 = _dq_weight(nodes, inits, "w1", rng.integers(-127, 128, (K, N)).astype(np.int8),
                    rng.uniform(0.005, 0.02, N).astype(np.float32), np.zeros(N, np.int8), axis=1)
    nodes.append(helper.make_node("MatMul", [x, w1], ["m1"]))
    h = _dq_pair(nodes, inits, "h", "m1", 0.1, 100)
    w2 = _dq_weight(nodes, inits, "w2", rng.integers(0, 256, (K, N)).astype(np.uint8),
                    np.full(K, 0.01, np.float32), np.full(K, 128, np.uint8), axis=0)
    inits.append(numpy_helper.from_array(rng.normal(0, 0.1, K).astype(np.float32), "b2"))
    nodes.append(helper.make_node("Gemm", [h, w2, "b2"], ["g"], transB=1))
    g = _dq_pair(nodes, inits, "g", "g", 0.1, 128)
    nodes.append(helper.make_node("Transpose", [x], ["xt"], perm=[1, 0]))
    nodes.append(helper.make_node("MatMul", [x, "xt"], ["aa"]))                       # two activations
    w3 = _dq_weight(nodes, inits, "w3", rng.integers(-127, 128, (K, 4)).astype(np.int8),
                    np.array(0.01, np.float32), np.array(0, np.int8), axis=1)
    nodes.append(helper.make_node("MatMul", [g, w3], ["narrow"]))                     # 4 columns
    y = _dq_pair(nodes, inits, "y", "g", Y_SCALE, 128)
    nodes.append(helper.make_node("Identity", [y], ["out"]))
    outs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [M, K]),
            helper.make_tensor_value_info("aa", TensorProto.FLOAT, [M, M]),
            helper.make_tensor_value_info("narrow", TensorProto.FLOAT, [M, 4])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])], outs,
                              inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def _imported(tmp_path) -> tvm.IRModule:
    path = save_model(_model(), tmp_path / "qdq.onnx")
    return import_relax(load_model(Path(path)), {"x": (M, K)}, {"x": "float32"})[0]


def _run(mod: tvm.IRModule, x: np.ndarray) -> list[np.ndarray]:
    vm = relax.VirtualMachine(tvm.compile(legalize(fold_constants(mod)[0]), target="llvm"), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    return [out.numpy()] if isinstance(out, tvm.runtime.Tensor) else [o.numpy() for o in out]


def test_weight_matmuls_go_to_integers_and_the_rest_is_reported(tmp_path):
    mod, report = integer_kernels(_imported(tmp_path), (PAIR,))
    assert report.details["integer"] == 3 and report.details["padded"] == 1
    assert report.details["kept"] == {"two activations": 1}
    assert "3 matmul(s) in int8" in report.summary and "1 with N (output channels) padded" in report.summary
    calls = [f for gv, f in mod.functions.items() if gv.name_hint.startswith("matmul_int8")]
    assert len(calls) == 3


def test_a_matmul_under_half_a_quad_panel_takes_pairs(tmp_path):
    """With VNNI (QUAD first): 24 columns are a panel and a half of 16, in quads; 4 columns are
    under half of one, so they take pairs (half a panel of 8)."""
    mod, report = integer_kernels(_imported(tmp_path), (QUAD, PAIR))
    assert report.details["groups"] == {"2": 1, "4": 2} and report.details["padded"] == 2
    narrow = next(f for gv, f in mod.functions.items() if gv.name_hint.startswith("matmul_int8")
                  and [int(d) for d in f.params[1].shape] == [1, K // 2, PANEL, 2])
    assert [int(d) for d in narrow.params[-1].shape] == [M, 4]


def _conv_model() -> onnx.ModelProto:
    """Four convs of a QDQ model: 3 input channels at stride 2 (C odd: a zero channel pads the
    pairs), a dilated 3x3 with padding 2, a depthwise one, and a grouped one (both exact in float32)."""
    rng = np.random.default_rng(4)
    nodes, inits = [], []
    x = _dq_pair(nodes, inits, "x", "x", 0.04, 128)
    w1 = _dq_weight(nodes, inits, "w1", rng.integers(-127, 128, (16, 3, 3, 3)).astype(np.int8),
                    rng.uniform(0.005, 0.02, 16).astype(np.float32), np.zeros(16, np.int8), axis=0)
    inits.append(numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), "b1"))
    nodes.append(helper.make_node("Conv", [x, w1, "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]))
    h = _dq_pair(nodes, inits, "h", "c1", 0.1, 100)
    w2 = _dq_weight(nodes, inits, "w2", rng.integers(-127, 128, (24, 16, 3, 3)).astype(np.int8),
                    np.array(0.01, np.float32), np.array(0, np.int8), axis=0)
    nodes.append(helper.make_node("Conv", [h, w2], ["c2"], pads=[2, 2, 2, 2], dilations=[2, 2]))
    g = _dq_pair(nodes, inits, "g", "c2", 0.1, 128)
    w3 = _dq_weight(nodes, inits, "w3", rng.integers(-127, 128, (24, 1, 3, 3)).astype(np.int8),
                    np.full(24, 0.01, np.float32), np.zeros(24, np.int8), axis=0)
    nodes.append(helper.make_node("Conv", [g, w3], ["c3"], pads=[1, 1, 1, 1], group=24))
    d = _dq_pair(nodes, inits, "d", "c3", 0.1, 128)
    w4 = _dq_weight(nodes, inits, "w4", rng.integers(-127, 128, (24, 12, 1, 1)).astype(np.int8),
                    np.full(24, 0.0005, np.float32), np.zeros(24, np.int8), axis=0)
    nodes.append(helper.make_node("Conv", [d, w4], ["c4"], group=2))
    y = _dq_pair(nodes, inits, "y", "c4", Y_SCALE, 128)
    nodes.append(helper.make_node("Identity", [y], ["out"]))
    graph = helper.make_graph(nodes, "qconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, CONV_IN)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 24, 8, 8])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


CONV_IN = [1, 3, 15, 15]


def test_convs_go_to_integers_and_grouped_ones_to_exact_float_sums(tmp_path):
    """The depthwise and the grouped conv sum 9 and 12 products per output: float32 convs of the
    integers (x_q - x_zp, w_q - w_zp), exact, so their outputs are the int32 path's to the bit."""
    mod = import_relax(load_model(save_model(_conv_model(), tmp_path / "c.onnx")), {"x": tuple(CONV_IN)},
                       {"x": "float32"})[0]
    out, report = integer_kernels(mod, (PAIR,))
    assert {k: report.details[k] for k in ("integer", "convs", "exact", "kept")} == \
        {"integer": 4, "convs": 4, "exact": 2, "kept": {}}
    assert "4 conv(s) in int8" in report.summary and "2 of the convs (grouped, or not fit" in report.summary
    assert sorted(gv.name_hint for gv in out.functions if "int8" in gv.name_hint) == ["conv2d_int8", "conv2d_int81"]
    x = np.random.default_rng(5).normal(0, 2, CONV_IN).astype(np.float32)
    want, got = _run(mod, x)[0], _run(out, x)[0]
    steps = np.abs(want - got) / Y_SCALE
    assert (np.abs(want) >= 6.35).mean() < 0.01                     # not saturated
    assert want.std() > 10 * Y_SCALE and steps.max() <= 1.0 + 1e-4 and (steps > 0.5).mean() <= 0.02


def test_the_exact_float_conv_is_the_integer_sum_and_long_grouped_sums_stay_float(tmp_path):
    """A depthwise 5x5 over 8-bit extremes sums to the int32 result exactly; a 1x1 conv to 3
    channels (under half a panel of 8) and one with u8 weights up to 255 (out of int8) are exact
    in float32 too; a grouped conv of 128 channels per
    group over 3x3 taps with weights at +-127 (sums up to 1152 x 127 x 128 > 2^24) keeps the float
    path."""
    rng = np.random.default_rng(11)
    nodes, inits = [], []
    x = _dq_pair(nodes, inits, "x", "x", 1.0, 0)
    wq = rng.choice(np.array([-128, 127], np.int8), (8, 1, 5, 5))
    wq[0] = -128                                                      # channel 0: 25 x 255 x -128
    w = _dq_weight(nodes, inits, "w", wq, np.ones(8, np.float32), np.zeros(8, np.int8), axis=0)
    nodes.append(helper.make_node("Conv", [x, w], ["dw"], pads=[2, 2, 2, 2], group=8))
    g = _dq_weight(nodes, inits, "g", rng.choice(np.array([-127, 127], np.int8), (8, 128, 3, 3)),
                   np.full(8, 0.01, np.float32), np.zeros(8, np.int8), axis=0)
    x2 = _dq_pair(nodes, inits, "x2", "x2", 0.1, 128)
    nodes.append(helper.make_node("Conv", [x2, g], ["grouped"], pads=[1, 1, 1, 1], group=2))
    six = _dq_weight(nodes, inits, "six", rng.integers(-127, 128, (3, 8, 1, 1)).astype(np.int8),
                     np.full(3, 0.5, np.float32), np.zeros(3, np.int8), axis=0)
    nodes.append(helper.make_node("Conv", [x, six], ["narrow"]))
    u8 = _dq_weight(nodes, inits, "u8", rng.integers(0, 256, (8, 8, 1, 1)).astype(np.uint8),
                    np.full(8, 0.5, np.float32), np.zeros(8, np.uint8), axis=0)
    nodes.append(helper.make_node("Conv", [x, u8], ["unsigned"]))
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6]),
                                           helper.make_tensor_value_info("x2", TensorProto.FLOAT, [1, 256, 4, 4])],
                              [helper.make_tensor_value_info("dw", TensorProto.FLOAT, [1, 8, 6, 6]),
                               helper.make_tensor_value_info("grouped", TensorProto.FLOAT, [1, 8, 4, 4]),
                               helper.make_tensor_value_info("narrow", TensorProto.FLOAT, [1, 3, 6, 6]),
                               helper.make_tensor_value_info("unsigned", TensorProto.FLOAT, [1, 8, 6, 6])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    mod = import_relax(load_model(save_model(m, tmp_path / "e.onnx")), {"x": (1, 8, 6, 6), "x2": (1, 256, 4, 4)},
                       {"x": "float32", "x2": "float32"})[0]
    out, report = integer_kernels(mod, (PAIR,))
    assert report.details["exact"] == 3 and report.details["kept"] == {"grouped convolutions whose sums can pass 2^24": 1}
    xq = rng.choice(np.array([0, 255], np.float32), (1, 8, 6, 6))      # u8 extremes; x_zp 0, scale 1
    xq[0, 0] = 255
    vm = relax.VirtualMachine(tvm.compile(legalize(fold_constants(out)[0]), target="llvm"), tvm.cpu())
    outs = vm["main"](tvm.runtime.tensor(xq), tvm.runtime.tensor(np.zeros((1, 256, 4, 4), np.float32)))
    got = outs[0].numpy()
    for name, out in (("six_q", outs[2]), ("u8_q", outs[3])):      # 3 channels; u8 weights up to 255
        wv = numpy_helper.to_array(next(i for i in inits if i.name == name)).astype(np.int64)
        assert np.array_equal(out.numpy(), np.einsum("oc,nchw->nohw", wv[:, :, 0, 0], xq.astype(np.int64)) * 0.5)
    pad = np.pad(xq.astype(np.int64), ((0, 0), (0, 0), (2, 2), (2, 2)))
    want = np.zeros((1, 8, 6, 6), np.int64)
    for dy in range(5):
        for dx in range(5):
            want += pad[:, :, dy:dy + 6, dx:dx + 6] * wq[None, :, 0, dy, dx, None, None].astype(np.int64)
    assert np.abs(want).max() > 2 ** 19 and np.array_equal(got.astype(np.int64), want)


def test_a_conv1d_goes_to_integers(tmp_path):
    """NCW (an audio model's feature convs): stride 2, padding 1, 5 input channels."""
    rng = np.random.default_rng(9)
    nodes, inits = [], []
    x = _dq_pair(nodes, inits, "x", "x", 0.04, 128)
    w = _dq_weight(nodes, inits, "w", rng.integers(-127, 128, (16, 5, 3)).astype(np.int8),
                   rng.uniform(0.005, 0.02, 16).astype(np.float32), np.zeros(16, np.int8), axis=0)
    nodes.append(helper.make_node("Conv", [x, w], ["c"], pads=[1, 1], strides=[2]))
    y = _dq_pair(nodes, inits, "y", "c", Y_SCALE, 128)
    nodes.append(helper.make_node("Identity", [y], ["out"]))
    graph = helper.make_graph(nodes, "qconv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 20])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 16, 10])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    mod = import_relax(load_model(save_model(m, tmp_path / "c1.onnx")), {"x": (1, 5, 20)}, {"x": "float32"})[0]
    out, report = integer_kernels(mod, (PAIR,))
    assert report.details["convs"] == 1 and [gv.name_hint for gv in out.functions if "int8" in gv.name_hint] == ["conv1d_int8"]
    xv = rng.normal(0, 2, (1, 5, 20)).astype(np.float32)
    want, got = _run(mod, xv)[0], _run(out, xv)[0]
    steps = np.abs(want - got) / Y_SCALE
    assert want.std() > 10 * Y_SCALE and steps.max() <= 1.0 + 1e-4 and (steps > 0.5).mean() <= 0.02


def test_quads_subtract_the_zero_points_share_and_pad_the_last_panel(tmp_path):
    """A target with AVX-512 VNNI (QUAD first): the convs read uint8 activations (padding and the
    channel filling C = 3 up to 4 hold the zero point, 128 and 100) and subtract the zero point's
    share of each output's sum; the 24-channel one ends in half a panel of 16, zero columns. The
    result is the float path's up to a requantize flip."""
    mod = import_relax(load_model(save_model(_conv_model(), tmp_path / "c.onnx")), {"x": tuple(CONV_IN)},
                       {"x": "float32"})[0]
    out, report = integer_kernels(mod, (QUAD, PAIR))
    assert report.details["groups"] == {"4": 2} and report.details["padded"] == 1
    assert "2 as u8 x s8 quads (vpdpbusd)" in report.summary
    x = np.random.default_rng(5).normal(0, 2, CONV_IN).astype(np.float32)
    want, got = _run(mod, x)[0], _run(out, x)[0]
    steps = np.abs(want - got) / Y_SCALE
    assert want.std() > 10 * Y_SCALE and steps.max() <= 1.0 + 1e-4 and (steps > 0.5).mean() <= 0.02


def test_signed_activations_are_offset_to_unsigned_quads(tmp_path):
    """An int8 activation (zero point -5) feeds vpdpbusd's unsigned operand as x_q + 128; the
    int32 sums equal (x_q - x_zp) x w exactly, so the output is the float path's up to a flip."""
    rng = np.random.default_rng(12)
    nodes, inits = [], []
    x = _dq_pair(nodes, inits, "x", "x", 0.04, -5, np.int8)
    w = _dq_weight(nodes, inits, "w", rng.integers(-127, 128, (K, 32)).astype(np.int8),
                   rng.uniform(0.005, 0.02, 32).astype(np.float32), np.zeros(32, np.int8), axis=1)
    nodes.append(helper.make_node("MatMul", [x, w], ["m"]))
    y = _dq_pair(nodes, inits, "y", "m", Y_SCALE, 0, np.int8)
    nodes.append(helper.make_node("Identity", [y], ["out"]))
    graph = helper.make_graph(nodes, "s8", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [M, 32])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    mod = import_relax(load_model(save_model(m, tmp_path / "s8.onnx")), {"x": (M, K)}, {"x": "float32"})[0]
    out, report = integer_kernels(mod, (QUAD, PAIR))
    assert report.details["groups"] == {"4": 1}
    kernel = next(f for gv, f in out.functions.items() if gv.name_hint == "matmul_int8")
    assert [(str(b.dtype), [int(d) for d in b.shape]) for b in kernel.params[:2]] == \
        [("uint8", [M, K]), ("int8", [2, K // 4, 16, 4])]
    xv = rng.normal(0, 2, (M, K)).astype(np.float32)
    want, got = _run(mod, xv)[0], _run(out, xv)[0]
    steps = np.abs(want - got) / Y_SCALE
    assert want.std() > 10 * Y_SCALE and steps.max() <= 1.0 + 1e-4 and (steps > 0.5).mean() <= 0.02


def test_quad_panels_group_four_channels_with_zero_channels_to_fill():
    w = np.random.default_rng(6).integers(-128, 128, (16, 3, 1, 1)).astype(np.int8)
    p = pack_conv(w, 16, 4)
    assert p.shape == (1, 1, 1, 1, 16, 4)
    assert p[0, 0, 0, 0, 5, 2] == w[5, 2, 0, 0] and (p[..., 3] == 0).all()


def test_conv_weights_are_pair_panels_with_a_zero_channel_for_odd_c():
    w = np.random.default_rng(6).integers(-128, 128, (16, 3, 2, 3)).astype(np.int8)
    p = pack_conv(w)
    assert p.shape == (2, 2, 3, 2, PANEL, 2) and p.dtype == np.int8
    assert p[1, 1, 2, 0, 5, 1] == w[PANEL + 5, 1, 1, 2] and p[1, 1, 2, 1, 5, 0] == w[PANEL + 5, 2, 1, 2]
    assert (p[:, :, :, 1, :, 1] == 0).all()                            # channel 3 of 4: the zero pad


def test_the_integer_module_computes_what_the_float_one_does(tmp_path):
    mod = _imported(tmp_path)
    x = np.random.default_rng(1).normal(0, 2, (M, K)).astype(np.float32)
    want, got = _run(mod, x), _run(integer_kernels(mod, (PAIR,))[0], x)
    for w, g in zip(want, got):
        assert w.shape == g.shape
    # the requantized output: a flip of one step where the float path's rounding crossed a boundary
    steps = np.abs(want[0] - got[0]) / Y_SCALE
    assert steps.max() <= 1.0 + 1e-4 and (steps > 0.5).mean() <= 0.02
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5)          # kept in float: the same kernel
    np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-6)


def test_weights_are_int8_pair_panels():
    w = np.arange(4 * 16, dtype=np.int64).reshape(4, 16).astype(np.int8)
    p = pack_panels(w)
    assert p.shape == (16 // PANEL, 2, PANEL, 2) and p.dtype == np.int8
    assert p[1, 1, 3, 0] == w[2, PANEL + 3] and p[1, 1, 3, 1] == w[3, PANEL + 3]


def test_the_compute_sums_exactly_in_int32():
    a = te.placeholder((3, 8), "int16", "a")
    panels = te.placeholder((2, 4, PANEL, 2), "int8", "w")
    lib = tvm.compile(te.create_prim_func([a, panels, int_matmul(a, panels)]), target="llvm")
    rng = np.random.default_rng(2)
    an = rng.integers(-255, 256, (3, 8)).astype(np.int16)
    wn = rng.integers(-128, 128, (8, 16)).astype(np.int8)
    out = tvm.runtime.tensor(np.zeros((3, 16), np.int32))
    lib(tvm.runtime.tensor(an), tvm.runtime.tensor(pack_panels(wn)), out)
    np.testing.assert_array_equal(out.numpy(), an.astype(np.int64) @ wn.astype(np.int64))


def test_a_model_without_qdq_is_left_alone(tmp_path):
    rng = np.random.default_rng(0)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "f",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                          [numpy_helper.from_array(rng.normal(size=(8, 8)).astype(np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    mod = import_relax(load_model(save_model(m, tmp_path / "f.onnx")), {"x": (2, 8)}, {"x": "float32"})[0]
    out, report = integer_kernels(mod, (PAIR,))
    assert report.details["integer"] == 0 and report.details["round_trips"] == 0
    assert "no dequantized matmul or conv" in report.summary
    assert tvm_ffi.structural_equal(out, mod)


def _build(tmp_path, model: Path, int8: bool, shape: list[int] = (M, K)) -> Path:
    out = tmp_path / f"pkg_{int8}"
    spec = write_spec(tmp_path, f"name: qdq\nmodel: {model}\noutput: {out}\ninputs:\n  x: {{dtype: float32, shape: {list(shape)}}}\n"
                      f"targets: [x86-64]\noptimize:\n  passes: {{int8: {str(int8).lower()}}}\n", f"spec_{int8}.yaml")
    r = run_pack("build", spec)
    assert r.returncode == 0, r.stderr
    return out


def test_a_qdq_package_stores_int8_weights_and_passes_its_check(tmp_path):
    """pack build as a user runs it: the report line, int8 weight panels in weights.bin (a quarter
    of their float32 bytes), vpmaddwd (vpdpwssd with VNNI) in the kernels, and packrt-run --check
    against onnxruntime."""
    host_target()
    model = save_model(_model(), tmp_path / "qdq.onnx")
    pkg, plain = _build(tmp_path, model, True), _build(tmp_path, model, False)
    report = json.loads((pkg / "build_report.json").read_text())
    int8 = next(p for p in report["targets"][0]["kernel_passes"] if p["pass"] == "int8")
    assert int8["details"]["integer"] == 3 and int8["status"] == "applied"
    weights = (pkg / "targets/x86-64/weights.bin").stat().st_size
    float_weights = (plain / "targets/x86-64/weights.bin").stat().st_size
    assert weights < 0.4 * float_weights          # 4 bytes -> 1, but a panel of 16 pads N = 24 to 32 (VNNI)
    asm = packrt.run(["objdump", "-d", pkg / "targets/x86-64/kernels.so"]).stdout
    plain_asm = packrt.run(["objdump", "-d", plain / "targets/x86-64/kernels.so"]).stdout
    pair = "vpdpwssd" if "avx512vnni" in host_target().llvm_features else "vpmaddwd"   # LLVM fuses the add with VNNI
    assert pair in asm and pair not in plain_asm
    check = packrt.run(packrt.cli(pkg) + [pkg, "--check"])
    assert check.returncode == 0 and " ok " in check.stdout, check.stdout + check.stderr


def test_a_qdq_cnn_package_runs_its_convs_in_integers_and_passes_its_check(tmp_path):
    """The conv model through the whole build: int-dot conv kernels, the depthwise and grouped
    convs as exact float convs, and packrt-run --check against onnxruntime."""
    host_target()
    pkg = _build(tmp_path, save_model(_conv_model(), tmp_path / "qconv.onnx"), True, CONV_IN)
    report = json.loads((pkg / "build_report.json").read_text())
    passes = {p["pass"]: p for p in report["targets"][0]["kernel_passes"]}
    assert passes["int8"]["details"]["convs"] == 4 and passes["int8"]["details"]["exact"] == 2
    assert "2 int-dot" in passes["schedule"]["summary"]
    if "avx512vnni" in host_target().llvm_features:      # both as quads, the 24-channel one padded to 32
        assert passes["int8"]["details"]["groups"] == {"4": 2}
        assert "vpdpbusd" in packrt.run(["objdump", "-d", pkg / "targets/x86-64/kernels.so"]).stdout
    check = packrt.run(packrt.cli(pkg) + [pkg, "--check"])
    assert check.returncode == 0 and " ok " in check.stdout, check.stdout + check.stderr
