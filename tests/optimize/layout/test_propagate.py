"""The layout pass on small ONNX graphs: chosen layouts applied, conversions counted before and
after propagation, weights packed at build time, results equal to onnxruntime."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from packager.frontend import LoadedModel, TensorInfo, import_relax
from packager.optimize.schedule.registry import scheduler_for
from packager.optimize.layout.propagate import alter_layouts
from packager.optimize.layout.search import Decision, candidates
from packager.optimize.layout.sites import ConvSite
from packager.optimize.pipeline import optimize_graph
from packager.spec import OptimizeSpec, TargetSpec
from packager.targets import resolve

RNG = np.random.default_rng(0)
X86 = resolve(TargetSpec("x86-64", {}, "t"))


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.2).astype(np.float32)


def _model(nodes, x_shape, inits, out="y"):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _conv(x, w, b, y, **attrs):
    return helper.make_node("Conv", [x, w, b] if b else [x, w], [y], **attrs)


class _Uncharged:
    counts: dict = {}

    def note(self) -> str:
        return "no conversions charged (layouts pinned by the test)"


class FixedSearch:
    """Decides every conv's blocks from a list (in topological order), so the tests pin layouts."""

    measuring = False
    conversions = _Uncharged()

    def __init__(self, blocks, panels: int = 0):
        self.blocks = list(blocks)
        self.panels = panels

    def decide(self, site: ConvSite, incoming: int, allowed_out=None, next_conv=None, pool=None, padding=None) -> Decision:
        data_block, out_block = self.blocks.pop(0)
        data_block = incoming if data_block is None else data_block
        return Decision(data_block, out_block, *site.weight_blocks(data_block, out_block))

    def decide_matmul(self, site):
        from packager.optimize.layout.search import MatmulDecision
        return MatmulDecision(self.panels, {}, False)

    def save(self):
        pass


def _relax(model):
    shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    loaded = LoadedModel(None, model, 17, [TensorInfo("x", "float32", shape)], [TensorInfo("y", "float32", ())])
    return import_relax(loaded, {"x": shape}, {"x": "float32"})[0], shape


def _run(model, blocks, panels=0):
    """(report, output of the re-laid-out graph, onnxruntime's output)."""
    mod, shape = _relax(model)
    laid, report = alter_layouts(mod, scheduler_for(X86), search=FixedSearch(blocks, panels))
    from packager.optimize.relax_util import legalize
    from packager.optimize.layout.conv import legalize_conv2d
    built = relax.build(legalize(laid, {"relax.nn.conv2d": legalize_conv2d}), target="llvm")
    vm = relax.VirtualMachine(built, tvm.cpu())
    x = RNG.standard_normal(shape).astype(np.float32)
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return report, got, ref


def test_conv_bias_relu_chain_and_residual_need_no_inner_conversions():
    """conv -> bias -> relu -> conv -> residual add -> relu: the layout flows through the
    element-wise ops and the add; only the graph input and output are converted."""
    m = _model([_conv("x", "w1", "b1", "c1", pads=[1] * 4), helper.make_node("Relu", ["c1"], ["r1"]),
                _conv("r1", "w2", "b2", "c2", pads=[1] * 4), helper.make_node("Add", ["c2", "r1"], ["s"]),
                helper.make_node("Relu", ["s"], ["y"])],
               [1, 16, 8, 8], {"w1": _w(32, 16, 3, 3), "b1": _w(32), "w2": _w(32, 32, 3, 3), "b2": _w(32)})
    report, got, ref = _run(m, [(16, 16), (None, 16)])
    d = report.details
    assert d["packed"] == 2 and d["conversions_before"] == 4 and d["conversions_after"] == 2
    assert d["constants_relaid"] == 4                           # two weights + two biases, folded offline
    assert [c["layouts"] for c in d["per_conv"]] == [["NCHW16c", "OIHW16i16o", "NCHW16c"]] * 2
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_adjacent_convs_with_different_layouts_get_one_conversion():
    """ALT Constraint 3: conv (out 16c) -> conv (reads NCHW): exactly one conversion between."""
    m = _model([_conv("x", "w1", None, "c1"), _conv("c1", "w2", None, "y")],
               [1, 32, 6, 6], {"w1": _w(64, 32, 1, 1), "w2": _w(64, 64, 1, 1)})
    report, got, ref = _run(m, [(32, 16), (1, 1)])
    assert report.details["conversions_after"] == 2             # the graph input, and between the convs
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    report_same, got, ref = _run(m, [(32, 32), (None, 1)])        # second conv reads 32c, writes NCHW
    assert report_same.details["conversions_after"] == 1
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_blocks_tvm_cannot_convert_fall_back_to_one_block():
    """NCHW16c -> NCHW32c has no ConvertLayout rule (TVM: "Invalid layout axis 32b"): the pass
    keeps the search's packed-or-NCHW choice per tensor with one block for all, says so, and
    stays correct."""
    m = _model([_conv("x", "w1", None, "c1"), _conv("c1", "w2", None, "c2"), _conv("c2", "w3", None, "y")],
               [1, 32, 6, 6], {"w1": _w(64, 32, 1, 1), "w2": _w(64, 64, 1, 1), "w3": _w(64, 64, 1, 1)})
    report, got, ref = _run(m, [(32, 16), (32, 32), (32, 1)])
    n = X86.vector_lanes_f32                                      # 16 with AVX-512, 8 with AVX2
    assert f"every packed block {n} lanes" in report.summary and report.details["packed"] == 3
    assert [tuple(c["layouts"]) for c in report.details["per_conv"]] == \
        [(f"NCHW{n}c", f"OIHW{n}i{n}o", f"NCHW{n}c")] * 2 + [(f"NCHW{n}c", f"OIHW{n}i1o", "NCHW")]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_mobilenet_block_depthwise_clip_and_projection():
    """expand 1x1 -> clip (relu6) -> depthwise 3x3 stride 1 -> clip -> project 1x1 -> + input."""
    m = _model([_conv("x", "we", "be", "e"), helper.make_node("Clip", ["e", "lo", "hi"], ["e6"]),
                _conv("e6", "wd", "bd", "d", pads=[1] * 4, group=96), helper.make_node("Clip", ["d", "lo", "hi"], ["d6"]),
                _conv("d6", "wp", "bp", "p"), helper.make_node("Add", ["p", "x"], ["y"])],
               [1, 16, 10, 10], {"we": _w(96, 16, 1, 1), "be": _w(96), "wd": _w(96, 1, 3, 3), "bd": _w(96),
                                 "wp": _w(16, 96, 1, 1), "bp": _w(16), "lo": np.array(0, np.float32),
                                 "hi": np.array(6, np.float32)})
    report, got, ref = _run(m, [(16, 32), (None, 32), (None, 16)])
    assert report.details["packed"] == 3, report.summary
    assert report.details["per_conv"][1]["layouts"] == ["NCHW32c", "OIHW1i32o", "NCHW32c"]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_leaky_relu_keeps_the_packed_layout_for_any_slope():
    """AECMOS's Conv -> LeakyRelu -> MaxPool stages: LeakyRelu has no layout rule in TVM 0.27,
    so it is rewritten as max/min ops (0 <= alpha <= 1: max(x, alpha * x); else max(x, 0) +
    alpha * min(x, 0)); only the graph input and output are converted."""
    m = _model([_conv("x", "w1", "b1", "a", pads=[1] * 4), helper.make_node("LeakyRelu", ["a"], ["l1"], alpha=0.1),
                helper.make_node("MaxPool", ["l1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                _conv("p", "w2", None, "b", pads=[1] * 4), helper.make_node("LeakyRelu", ["b"], ["y"], alpha=2.5)],
               [1, 16, 8, 8], {"w1": _w(32, 16, 3, 3), "b1": _w(32), "w2": _w(16, 32, 3, 3)})
    report, got, ref = _run(m, [(16, 16), (None, 16)])
    assert report.details["clip_ops_rewritten"] == 2 and report.details["conversions_after"] == 2, report.summary
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_unary_element_wise_ops_keep_the_packed_layout():
    """Abs, Erf, Floor, Cos... carry a packed layout in ConvertLayout (TVM's unary rule): the walk
    follows them too, so the conv after reads the producer's block, not NCHW behind a conversion."""
    m = _model([_conv("x", "w1", None, "a", pads=[1] * 4), helper.make_node("Abs", ["a"], ["b"]),
                helper.make_node("Erf", ["b"], ["c"]), helper.make_node("Floor", ["c"], ["d"]),
                helper.make_node("Cos", ["d"], ["e"]), _conv("e", "w2", None, "y", pads=[1] * 4)],
               [1, 16, 8, 8], {"w1": _w(32, 16, 3, 3), "w2": _w(16, 32, 3, 3)})
    report, got, ref = _run(m, [(16, 16), (None, 16)])
    assert report.details["conversions_after"] == 2, report.summary
    assert report.details["per_conv"][1]["layouts"][0] == "NCHW16c"
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def _prelu_stages(slopes_1, slopes_2):
    return _model([_conv("x", "w1", "b1", "a", pads=[1] * 4), helper.make_node("PRelu", ["a", "s1"], ["l1"]),
                   helper.make_node("MaxPool", ["l1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                   _conv("p", "w2", None, "b", pads=[1] * 4), helper.make_node("PRelu", ["b", "s2"], ["y"])],
                  [1, 16, 8, 8], {"w1": _w(32, 16, 3, 3), "b1": _w(32), "w2": _w(16, 32, 3, 3),
                                  "s1": slopes_1, "s2": slopes_2})


def test_prelu_keeps_the_packed_layout():
    """MTCNN's Conv -> PRelu -> MaxPool stages: relax.nn.prelu's layout rule refuses channel
    blocks, so it is rewritten as max/min ops with its per-channel slopes broadcast; only the
    graph input and output are converted, and the values match onnxruntime for slopes below 0,
    in [0, 1] and above 1."""
    slopes = np.linspace(-1.5, 2.5, 32, dtype=np.float32).reshape(1, 32, 1, 1)
    m = _prelu_stages(slopes, np.linspace(0, 1, 16, dtype=np.float32).reshape(1, 16, 1, 1))
    report, got, ref = _run(m, [(16, 16), (None, 16)])
    assert report.details["clip_ops_rewritten"] == 2 and report.details["conversions_after"] == 2, report.summary
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_prelu_with_constant_slopes_becomes_broadcast_ops():
    """Folded constant slopes become one full-rank constant; all of them in [0, 1]: max(x, a * x)."""
    from packager.optimize.layout.clip import clip_as_ops
    from packager.optimize.relax_util import count_ops

    m = _prelu_stages(np.linspace(-1, 3, 32, dtype=np.float32).reshape(1, 32, 1, 1),
                      np.linspace(0, 1, 16, dtype=np.float32).reshape(1, 16, 1, 1))
    mod, _ = _relax(m)
    out, n = clip_as_ops(relax.transform.FoldConstant()(mod))
    ops = count_ops(out)
    assert n == 2 and "relax.nn.prelu" not in ops and "relax.reshape" not in ops
    assert ops["relax.maximum"] == 2 and ops["relax.minimum"] == 1 and ops["relax.add"] == 2   # + the bias
    x = RNG.standard_normal((1, 16, 8, 8)).astype(np.float32)
    vm = relax.VirtualMachine(relax.build(out, target="llvm"), tvm.cpu())
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), ref, rtol=1e-4, atol=1e-4)


def test_concat_and_pooling_keep_the_packed_layout():
    m = _model([_conv("x", "w1", None, "a", pads=[1] * 4), _conv("x", "w2", None, "b", pads=[1] * 4),
                helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
                helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                _conv("p", "w3", None, "y")],
               [1, 8, 8, 8], {"w1": _w(16, 8, 3, 3), "w2": _w(32, 8, 3, 3), "w3": _w(16, 48, 1, 1)})
    report, got, ref = _run(m, [(1, 16), (1, 16), (16, 16)])
    assert report.details["conversions_after"] == 1             # only back to NCHW at the output
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_batchnorm_and_lower_rank_channel_constants_keep_the_packed_layout():
    """DenseNet's pattern: a BatchNorm that no conv absorbs (on a concat) and Caffe2-style
    per-channel scales as [C, 1, 1] constants. Both used to run in NCHW with a conversion on
    each side; as element-wise ops on full-rank constants they stay packed."""
    c = 48
    m = _model([_conv("x", "w1", None, "a", pads=[1] * 4), _conv("x", "w2", None, "b", pads=[1] * 4),
                helper.make_node("Concat", ["a", "b"], ["cat"], axis=1),
                helper.make_node("BatchNormalization", ["cat", "g", "beta", "mean", "var"], ["bn"]),
                helper.make_node("Mul", ["bn", "scale"], ["sc"]), helper.make_node("Add", ["sc", "shift"], ["sh"]),
                helper.make_node("Relu", ["sh"], ["r"]), _conv("r", "w3", None, "y")],
               [1, 8, 8, 8], {"w1": _w(16, 8, 3, 3), "w2": _w(32, 8, 3, 3), "w3": _w(16, c, 1, 1),
                              "g": _w(c) + 1, "beta": _w(c), "mean": _w(c), "var": np.abs(_w(c)) + 0.5,
                              "scale": _w(c, 1, 1), "shift": _w(c, 1, 1)})
    report, got, ref = _run(m, [(1, 16), (1, 16), (16, 16)])
    d = report.details
    assert d["batchnorms_decomposed"] == 1 and d["constants_full_rank"] >= 2, report.summary
    assert d["conversions_after"] == 1, report.summary          # only back to NCHW at the output
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_candidates_follow_the_producer_and_respect_divisibility():
    site = ConvSite((1, 24, 8, 8), (40, 24, 3, 3), (1, 1), (1,) * 4, (1, 1), 1, "float32")
    assert candidates(site, 1, 8) == [(1, 1), (1, 8), (8, 1), (8, 8)]         # 40 % 16 != 0
    assert candidates(site, 8, 8) == [(8, 1), (8, 8)]
    odd = ConvSite((1, 10, 8, 8), (10, 10, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, "float32")
    assert candidates(odd, 1, 16) == [(1, 1)]
    nchw_out = ConvSite((1, 32, 8, 8), (58, 32, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, "float32")
    assert candidates(nchw_out, 32, 16) == [(32, 1), (1, 1)]       # 58 channels: NCHW in, converted first
    assert candidates(site, 8, 8, allowed_out=(1,)) == [(8, 1), (1, 1)]


def test_channels_that_are_not_whole_vectors_are_offered_half_a_vector():
    """72 channels on AVX-512 (16 lanes): 8-lane blocks in and out (a depthwise 3x3 72@56 ran
    1.8x faster in NCHW8c than NCHW); where whole vectors fit, no half ones; quarter vectors (4
    lanes on AVX2) are not offered."""
    dw72 = ConvSite((1, 72, 8, 8), (72, 1, 3, 3), (1, 1), (1,) * 4, (1, 1), 72, "float32")
    assert candidates(dw72, 1, 16) == [(1, 1), (1, 8), (8, 1), (8, 8)]
    assert candidates(dw72, 8, 16) == [(8, 1), (8, 8)]
    to24 = ConvSite((1, 64, 8, 8), (24, 64, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, "float32")
    assert candidates(to24, 16, 16) == [(16, 1), (16, 8)]
    assert (1, 8) not in candidates(ConvSite((1, 64, 8, 8), (64, 64, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, "float32"),
                                    1, 16)
    dw36 = ConvSite((1, 36, 8, 8), (36, 1, 3, 3), (1, 1), (1,) * 4, (1, 1), 36, "float32")
    assert candidates(dw36, 1, 8) == [(1, 1)]
    assert candidates(dw72, 1, 16, half=False) == [(1, 1)]              # optimize.passes.half_blocks: false


def test_half_vector_blocks_compute_the_same():
    """expand 1x1 16->72 (NCHW8c out) -> depthwise 3x3 72 (8c) -> project 72->24 (8c) -> NCHW
    output (half a vector on AVX-512, whole ones on AVX2): equal to onnxruntime."""
    m = _model([_conv("x", "we", None, "e"), helper.make_node("Relu", ["e"], ["r"]),
                _conv("r", "wd", None, "d", pads=[1] * 4, group=72), _conv("d", "wp", None, "y")],
               [1, 16, 10, 10], {"we": _w(72, 16, 1, 1), "wd": _w(72, 1, 3, 3), "wp": _w(24, 72, 1, 1)})
    report, got, ref = _run(m, [(1, 8), (None, 8), (None, 8)])
    assert [c["layouts"][2] for c in report.details["per_conv"]] == ["NCHW8c"] * 3, report.summary
    if X86.vector_lanes_f32 == 16:                                # the report counts them where 8 is half a vector
        assert report.details["half_blocks"] == 3, report.summary
        assert "3 convs read or write half-vector blocks (8 lanes)" in report.summary
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_gpu_targets_keep_nchw_and_say_so():
    mod, _ = _relax(_model([_conv("x", "w1", None, "y")], [1, 16, 4, 4], {"w1": _w(16, 16, 1, 1)}))
    _, reports = optimize_graph(mod, OptimizeSpec(level=2), resolve(TargetSpec("h100", {}, "g")))
    layout = next(r for r in reports if r.name == "layout")      # the CUDA pipeline's layout pass
    assert "NCHW kept" in layout.summary and layout.details["packed"] == 0


def test_analytical_search_packs_convs_on_arm64(tmp_path):
    """No fixed choices: the joint search itself (Gensor estimates for arm64, deterministic) picks
    NEON-width blocks for a 64-channel 3x3 conv and the pipeline lowers the packed convs."""
    m = _model([_conv("x", "w1", "b1", "c1", pads=[1] * 4), helper.make_node("Relu", ["c1"], ["y"])],
               [1, 64, 14, 14], {"w1": _w(64, 64, 3, 3), "b1": _w(64)})
    mod, _ = _relax(m)
    arm = resolve(TargetSpec("arm64", {}, "a"))
    out, reports = optimize_graph(mod, OptimizeSpec(level=2, database=tmp_path), arm)
    layout = next(r for r in reports if r.name == "layout")
    assert layout.details["packed"] == 1, layout.summary
    (conv,) = layout.details["per_conv"]
    assert conv["layouts"][2] in ("NCHW4c", "NCHW8c") and len(conv["scores_ms"]) >= 3
    best = min(conv["scores_ms"].values())
    assert best <= conv["scores_ms"]["1/1"]                      # never worse than NCHW by its own model
    assert any("conv2d_packed" in gv.name_hint for gv in out.functions)


def test_matmul_weights_in_panels_match():
    """x @ W + b: W (K x N) stored as (N/n_t) K n_t at build time, the result unchanged."""
    m = _model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
               [2, 5, 24], {"w": _w(24, 48), "b": _w(48)})
    report, got, ref = _run(m, [], panels=16)
    assert report.details["matmuls"] == 1 and report.details["matmuls_packed"] == 1
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    mod, _ = _relax(m)
    out, _ = alter_layouts(mod, scheduler_for(X86), search=FixedSearch([], 16))
    consts = [b.value.args[1].fields[1] for blk in out["main"].body.blocks for b in blk.bindings
              if getattr(b.value.op, "name", "") == "relax.call_tir" and "matmul_packed" in b.value.args[0].name_hint]
    assert consts[0].value.numpy().shape == (3, 24, 16)


def test_matmul_weights_in_padded_panels_match():
    """N = 43 with n_t = 16 (a language-model head's odd vocabulary): B padded with zero columns
    to 3 panels, the kernel's result sliced back to 43 columns, the values unchanged."""
    m = _model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
               [1, 7, 24], {"w": _w(24, 43), "b": _w(43)})
    report, got, ref = _run(m, [], panels=16)
    assert report.details["matmuls_packed"] == 1
    assert got.shape == (1, 7, 43)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_padded_panels_hold_zeros_past_n():
    from packager.optimize.layout.matmul import pack_weight
    w = _w(6, 20)
    p = pack_weight(w, 8)
    assert p.shape == (3, 6, 8)
    np.testing.assert_array_equal(p[2, :, :4], w[:, 16:])
    assert not p[2, :, 4:].any()


def test_weight_panels_layout():
    from packager.optimize.layout.matmul import pack_weight, weight_panels
    w = _w(6, 32)
    p = pack_weight(w, 8)
    assert p.shape == (4, 6, 8)
    np.testing.assert_array_equal(p[1, 2], w[2, 8:16])
    np.testing.assert_array_equal(weight_panels(6, 32, 8).invert_np(p), w)


class Recorded(FixedSearch):
    """FixedSearch that records, per conv, the block it is told its input has (`incoming`) and
    the output blocks it is allowed (`allowed`)."""

    def __init__(self, blocks):
        super().__init__(blocks)
        self.incoming, self.allowed = [], []

    def decide(self, site, incoming, allowed_out=None, next_conv=None, pool=None, padding=None):
        self.incoming.append(incoming)
        self.allowed.append(allowed_out)
        return super().decide(site, incoming, allowed_out, next_conv, pool)


def test_conv_meeting_a_packed_tensor_downstream_must_use_its_block():
    """Residual add of two conv branches: TVM cannot convert NCHW16c <-> NCHW32c, so the conv
    decided second may only write the first one's block (or NCHW)."""
    from packager.optimize.layout.propagate import decide_layouts

    m = _model([_conv("x", "w1", None, "a"), helper.make_node("Relu", ["a"], ["ra"]),
                _conv("x", "w2", None, "b"), helper.make_node("Add", ["ra", "b"], ["y"])],
               [1, 16, 6, 6], {"w1": _w(32, 16, 1, 1), "w2": _w(32, 16, 1, 1)})
    mod, _ = _relax(m)
    search = Recorded([(1, 32), (1, 32)])
    decide_layouts(mod, search, 16)
    assert search.allowed == [None, (1, 32)]


def test_convs_writing_a_channel_concat_may_only_take_blocks_dividing_every_branch():
    """Inception's branches of 32 and 48 channels concatenated: 32 lanes would leave the
    48-channel branch NCHW, so the first conv decided is offered 16 lanes, the second the first's."""
    from packager.optimize.layout.propagate import decide_layouts

    m = _model([_conv("x", "w1", None, "a"), helper.make_node("Relu", ["a"], ["ra"]),
                _conv("x", "w2", None, "b"), helper.make_node("Concat", ["ra", "b"], ["y"], axis=1)],
               [1, 16, 6, 6], {"w1": _w(32, 16, 1, 1), "w2": _w(48, 16, 1, 1)})
    mod, _ = _relax(m)
    search = Recorded([(1, 16), (1, 16)])
    decide_layouts(mod, search, 16)
    assert search.allowed == [(1, 16), (1, 16)]


def test_convs_writing_a_concat_of_half_vector_branches_may_take_half_a_vector():
    """A GhostNet-style concat of 72 and 40 channels on 16 lanes: no 16-lane block divides both,
    8 does, so both convs are offered NCHW8c (with half_blocks off: NCHW only)."""
    from packager.optimize.layout.propagate import decide_layouts

    m = _model([_conv("x", "w1", None, "a"), _conv("x", "w2", None, "b"),
                helper.make_node("Concat", ["a", "b"], ["y"], axis=1)],
               [1, 16, 6, 6], {"w1": _w(72, 16, 1, 1), "w2": _w(40, 16, 1, 1)})
    mod, _ = _relax(m)
    search = Recorded([(1, 8), (1, 8)])
    decide_layouts(mod, search, 16)
    assert search.allowed == [(1, 8), (1, 8)]
    off = Recorded([(1, 1), (1, 1)])
    decide_layouts(mod, off, 16, half=False)                      # optimize.passes.half_blocks: false
    assert off.allowed == [(1,), (1,)]
    # as the pipeline runs it: the search behind the profile memo, the switch given to alter_layouts
    from packager.optimize.layout.memo import ProfileMemo
    piped = Recorded([(1, 1), (1, 1)])
    _, report = alter_layouts(mod, scheduler_for(X86), search=piped, memo=ProfileMemo(), half=False)
    assert piped.allowed == [(1,), (1,)]
    if X86.vector_lanes_f32 == 16:
        assert "half-vector blocks off in the spec" in report.summary


def test_tracked_ops_have_tvm_layout_rules():
    """The tracker must not expect propagation through an op ConvertLayout cannot carry a layout
    through (it would then ask for conversions TVM cannot express)."""
    from packager.optimize.layout.propagate import FOLLOW

    assert all(tvm.ir.Op.get(name).get_attr("FRelaxInferLayout") is not None for name in FOLLOW)


class ScoredSearch(FixedSearch):
    """FixedSearch whose decisions carry scores (ms per data/out blocks), as measured ones do."""

    def __init__(self, blocks, scores):
        super().__init__(blocks)
        self.scores = list(scores)

    def decide(self, site, incoming, allowed_out=None, next_conv=None, pool=None, padding=None):
        d = super().decide(site, incoming, allowed_out, next_conv, pool)
        d.scores = self.scores.pop(0)
        return d


def _depthwise_then_pointwise():
    return _model([_conv("x", "w1", None, "c1", group=32, pads=[1] * 4), helper.make_node("Relu", ["c1"], ["r"]),
                   _conv("r", "w2", None, "y")], [1, 32, 6, 6], {"w1": _w(32, 1, 3, 3), "w2": _w(32, 32, 1, 1)})


def _laid(model, search, monkeypatch):
    """The layout pass, with TVM's silent refusal (shufflenet: 2 of 49 convs left NCHW, no error;
    no small graph reproduced it) imitated: ConvertLayout is asked for NCHW for the first conv."""
    import packager.optimize.layout.apply as apply

    real = apply._callback

    def refusing(decisions):
        cb = real(decisions)
        first = decisions[0][0]
        return lambda call: ({"relax.nn.conv2d": ["NCHW", "OIHW", "NCHW"]} if getattr(call.op, "name", "") ==
                             "relax.nn.conv2d" and call.args[1].same_as(first) else cb(call))

    monkeypatch.setattr(apply, "_callback", refusing)
    mod, _ = _relax(model)
    return alter_layouts(mod, scheduler_for(X86), search=search)[1]


def test_a_conv_convertlayout_leaves_nchw_costs_only_itself_when_that_measures_faster(monkeypatch):
    """When ConvertLayout leaves a conv NCHW without an error, the others keep their choices if
    the scores of what was applied sum below uniform blocking's (which packed shufflenet's
    grouped convs the search had left NCHW: 1.9x slower); else uniform blocking is tried (which
    the imitated refusal refuses too here)."""
    n = X86.vector_lanes_f32
    cheap_nchw = [{"1/1": 1.0, f"1/{n}": 0.5, f"{n}/{n}": 5.0}, {"1/1": 1.0, f"{n}/{n}": 3.0}]
    report = _laid(_depthwise_then_pointwise(), ScoredSearch([(1, n), (1, 1)], cheap_nchw), monkeypatch)
    assert "refused by ConvertLayout for 1 conv(s)" in report.summary, report.summary
    assert report.details["packed"] == 0
    cheap_uniform = [{"1/1": 1.0, f"1/{n}": 0.5, f"{n}/{n}": 2.0}, {"1/1": 10.0, f"{n}/{n}": 1.0}]
    report = _laid(_depthwise_then_pointwise(), ScoredSearch([(1, n), (1, 1)], cheap_uniform), monkeypatch)
    assert "for 1 conv(s)" not in report.summary and "uniform blocking" in report.summary, report.summary


def test_convs_sharing_one_weight_each_get_their_own_layouts():
    """Two convs reading one weight initializer (the ONNX zoo's light models share identical
    weights) with different choices: each gets its own (the layout callback, which finds a
    conv's choice by its weight, once gave both the first one's)."""
    m = _model([_conv("x", "w", None, "a"), helper.make_node("Relu", ["a"], ["r"]), _conv("r", "w", None, "y")],
               [1, 16, 5, 5], {"w": _w(16, 16, 1, 1)})
    report, got, ref = _run(m, [(16, 16), (16, 1)])
    assert [c["layouts"] for c in report.details["per_conv"]] == [["NCHW16c", "OIHW16i16o", "NCHW16c"],
                                                                   ["NCHW16c", "OIHW16i1o", "NCHW"]]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_a_global_mean_keeps_the_block_of_the_conv_before_it():
    """conv (16c) -> GlobalAveragePool -> 1x1 conv (an SE block's squeeze): ConvertLayout carries
    16c through the mean, so the squeeze conv is told its input is 16c (told NCHW, it chose 8c
    on AVX2, which TVM cannot convert 16c into, and EfficientNet lost its searched layouts)."""
    m = _model([_conv("x", "w1", None, "a"), helper.make_node("GlobalAveragePool", ["a"], ["g"]),
                _conv("g", "w2", None, "y")], [1, 16, 6, 6], {"w1": _w(32, 16, 1, 1), "w2": _w(16, 32, 1, 1)})
    mod, shape = _relax(m)
    search = Recorded([(16, 16), (None, 16)])
    alter_layouts(mod, scheduler_for(X86), search=search)
    assert search.incoming == [1, 16]
