"""Output channels padded to whole blocks (layout/pad.py): the padded conv and the slice moved
below its element-wise epilogue compute what onnxruntime computes, and the search pads only
where the padded blocks measure faster."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from onnx import helper

from packager.optimize.layout.pad import Padding, pad_filters
from packager.optimize.layout.propagate import alter_layouts, bindings
from packager.optimize.layout.search import PAD_GAIN, Decision, LayoutSearch
from packager.optimize.layout.sites import ConvSite, PadContext
from packager.optimize.schedule.registry import scheduler_for
from packager.spec import OptimizeSpec

from test_propagate import X86, FixedSearch, _conv, _model, _relax, _run, _w


class PaddingSearch(FixedSearch):
    """Every conv computes its output channels padded to 16-channel blocks, as the search decides
    when that is faster."""

    def decide(self, site: ConvSite, incoming: int, allowed_out=None, next_conv=None, pool=None, padding=None) -> Decision:
        if site.out_channels % 16 == 0 or (padding is not None and not padding.own):
            return super().decide(site, incoming)
        self.blocks.pop(0)
        data = 16 if site.channels % 16 == 0 else 1
        return Decision(data, 16, *site.weight_blocks(data, 16), padded_from=site.out_channels)


def _ops(mod) -> list[str]:
    return [b.value.op.name for b in bindings(mod) if hasattr(b.value, "op") and hasattr(b.value.op, "name")]


def test_padded_conv_keeps_its_epilogue_and_matches_onnxruntime(monkeypatch):
    """conv (20 channels) -> bias -> relu -> global pool: computed as 32 channels in 16c blocks,
    the slice after the relu; the same result as onnxruntime."""
    m = _model([_conv("x", "w", "b", "c", pads=[1] * 4), helper.make_node("Relu", ["c"], ["r"]),
                helper.make_node("GlobalAveragePool", ["r"], ["y"])],
               [1, 16, 7, 7], {"w": _w(20, 16, 3, 3), "b": _w(20)})
    report, got, ref = _run_padded(m, [(16, 16)], monkeypatch)
    d = report.details
    assert d["padded_outputs"] == 1 and "1x 20->32" in report.summary
    conv = d["per_conv"][0]
    assert conv["weight"] == [32, 16, 3, 3] and conv["padded_from"] == 20
    assert conv["layouts"] == ["NCHW16c", "OIHW16i16o", "NCHW16c"]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def _run_padded(model, blocks, monkeypatch):
    import test_propagate
    monkeypatch.setattr(test_propagate, "FixedSearch", PaddingSearch)
    return _run(model, blocks)


def test_slice_moves_below_the_epilogue():
    """The relu and the bias add run on the padded tensor; one slice is left, after them."""
    m = _model([_conv("x", "w", "b", "c"), helper.make_node("Relu", ["c"], ["y"])],
               [1, 16, 5, 5], {"w": _w(20, 16, 1, 1), "b": _w(20)})
    mod, _ = _relax(m)
    laid, _ = alter_layouts(mod, scheduler_for(X86), search=PaddingSearch([(16, 16)]))
    ops = _ops(laid)
    assert ops.count("relax.strided_slice") == 1
    assert ops.index("relax.strided_slice") > ops.index("relax.nn.relu") > ops.index("relax.nn.conv2d")


def test_two_padded_convs_meet_in_one_slice_and_a_conv_reads_the_sliced_channels(monkeypatch):
    """An STFT's real and imaginary convs (20 channels each), squared and summed, then read by a
    conv: the slice moves below the sum, and the last conv reads 20 channels."""
    m = _model([_conv("x", "wr", None, "re"), _conv("x", "wi", None, "im"),
                helper.make_node("Mul", ["re", "re"], ["r2"]), helper.make_node("Mul", ["im", "im"], ["i2"]),
                helper.make_node("Add", ["r2", "i2"], ["p"]), _conv("p", "w2", None, "y")],
               [1, 16, 1, 30], {"wr": _w(20, 16, 1, 1), "wi": _w(20, 16, 1, 1), "w2": _w(16, 20, 1, 1)})
    report, got, ref = _run_padded(m, [(16, 16), (16, 16), (1, 16)], monkeypatch)
    assert report.details["padded_outputs"] == 2
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_channel_constants_are_padded_with_their_last_value():
    pad = Padding(3, 5)
    bias = np.arange(3, dtype=np.float32).reshape(1, 3, 1, 1)
    assert pad.constant(bias).ravel().tolist() == [0, 1, 2, 2, 2]
    assert pad.constant(np.float32(2)) == 2                                       # a scalar broadcasts
    plane = np.ones((1, 1, 4, 4), np.float32)
    assert pad.constant(plane) is plane                                           # one value per position
    assert pad.constant(np.ones((1, 4, 1, 1), np.float32)) is None                # not this tensor's channels
    w = pad_filters(np.ones((3, 2, 1, 1), np.float32), 8)
    assert w.shape == (8, 2, 1, 1) and w[3:].sum() == 0 and w[:3].sum() == 6


def test_groups_are_padded_each_at_its_end():
    grouped = Padding(4, 8, groups=2)
    bias = np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1)
    assert grouped.constant(bias).ravel().tolist() == [0, 1, 1, 1, 2, 3, 3, 3]
    w = pad_filters(np.arange(1, 5, dtype=np.float32).reshape(4, 1, 1, 1), 8, groups=2)
    assert w.ravel().tolist() == [1, 2, 0, 0, 3, 4, 0, 0]


def test_grouped_conv_padded_per_group_matches_onnxruntime(monkeypatch):
    """A grouped 1x1 conv with 12 output channels per group (ShuffleNet's 68 at 16 lanes) ->
    BatchNorm -> ReLU: computed with 16 per group, taken back with reshape, slice, reshape."""
    g, c = 3, 36
    m = _model([_conv("x", "w", None, "c", group=g),
                helper.make_node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["n"]),
                helper.make_node("Relu", ["n"], ["y"])],
               [1, c, 5, 5], {"w": _w(c, c // g, 1, 1), "s": _w(c) + 1, "b": _w(c), "mu": _w(c),
                              "var": np.abs(_w(c)) + 0.5})
    report, got, ref = _run_padded(m, [(16, 16)], monkeypatch)
    assert "1x 36->48 in 3 groups" in report.summary
    conv = report.details["per_conv"][0]
    assert conv["weight"] == [48, 12, 1, 1] and conv["layouts"] == ["NCHW", "OIHW1i16o", "NCHW16c"]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


SITE = ConvSite((1, 16, 8, 8), (20, 16, 3, 3), (1, 1), (1,) * 4, (1, 1), 1, "float32")


class TableSearch(LayoutSearch):
    """The real padding decision over a table of conv scores (no timing)."""

    def __init__(self, database, padded_ms: float, pad: bool = True):
        super().__init__(scheduler_for(X86, OptimizeSpec(database=database, measure=False)), pad)
        self.lanes, self.padded_ms = 16, padded_ms

    def _score(self, site, data_block, out_block):
        if site.out_channels == 20:
            return 1.0 if out_block == 1 else 9.0
        return self.padded_ms if out_block == 16 else 1.1


def test_search_pads_only_when_the_padded_blocks_beat_the_unpadded_conv(tmp_path):
    d = TableSearch(tmp_path / "a.json", padded_ms=0.5).decide(SITE, 16)
    assert (d.padded_from, d.out_block, d.w_out) == (20, 16, 16)
    assert TableSearch(tmp_path / "b.json", padded_ms=PAD_GAIN * 1.0).decide(SITE, 16).padded_from == 0
    assert TableSearch(tmp_path / "c.json", padded_ms=0.5, pad=False).decide(SITE, 16).padded_from == 0


def test_padding_taken_back_before_a_concat_is_not_bound_by_the_blocks_the_real_channels_allow(tmp_path):
    """A conv into a concat whose channels allow NCHW only: padded, its output is taken back to
    NCHW before the concat, so the padded candidate may still write 16c blocks; where the padding
    flows on to a padded partner, that partner's blocks still bind it."""
    d = TableSearch(tmp_path / "a.json", padded_ms=0.5).decide(SITE, 16, allowed_out=(1,))
    assert (d.padded_from, d.out_block) == (20, 16)
    bound = TableSearch(tmp_path / "b.json", padded_ms=0.5).decide(SITE, 16, allowed_out=(1,),
                                                                   padding=PadContext(flows=True))
    assert bound.padded_from == 0 and bound.out_block == 1


def test_padding_is_scored_only_for_plain_convs_with_modest_padding():
    assert SITE.padded(16).out_channels == 32
    assert SITE.padded(4) is None                                                # whole blocks already
    assert ConvSite((1, 16, 8, 8), (3, 16, 3, 3), (1, 1), (1,) * 4, (1, 1), 1, "float32").padded(16) is None
    assert ConvSite((1, 20, 8, 8), (20, 1, 3, 3), (1, 1), (1,) * 4, (1, 1), 20, "float32").padded(16) is None
    grouped = ConvSite((1, 272, 8, 8), (272, 68, 1, 1), (1, 1), (0,) * 4, (1, 1), 4, "float32")
    assert grouped.padded(16).out_channels == 320 and grouped.padded(8).out_channels == 288
    spanning = ConvSite((1, 64, 8, 8), (64, 8, 3, 3), (1, 1), (1,) * 4, (1, 1), 8, "float32")
    assert spanning.padded(16) is None                                            # a block spans 2 groups


def _inverted_residual(mid: int = 20):
    """MobileNetV3's block: expand 1x1 (mid channels) -> ReLU -> depthwise 3x3 + bias -> ReLU ->
    squeeze-excite (mean, 1x1 to 8, ReLU, 1x1 back to mid, sigmoid, multiply) -> project 1x1."""
    nodes = [_conv("x", "we", None, "e"), helper.make_node("Relu", ["e"], ["er"]),
             _conv("er", "wd", "bd", "d", group=mid, pads=[1] * 4), helper.make_node("Relu", ["d"], ["dr"]),
             helper.make_node("GlobalAveragePool", ["dr"], ["s"]), _conv("s", "ws1", None, "s1"),
             helper.make_node("Relu", ["s1"], ["s1r"]), _conv("s1r", "ws2", None, "s2"),
             helper.make_node("Sigmoid", ["s2"], ["g"]), helper.make_node("Mul", ["dr", "g"], ["m"]),
             _conv("m", "wp", None, "y")]
    inits = {"we": _w(mid, 16, 1, 1), "wd": _w(mid, 1, 3, 3), "bd": _w(mid), "ws1": _w(8, mid, 1, 1),
             "ws2": _w(mid, 8, 1, 1), "wp": _w(16, mid, 1, 1)}
    return _model(nodes, [1, 16, 6, 6], inits)


def test_padded_channels_flow_through_depthwise_conv_and_se_block_into_the_next_conv(monkeypatch):
    """The expand conv's 20 channels computed as 32 run through the ReLU, the depthwise conv
    (zero filters for the padding), the SE block (its mean, and its second conv padded too) and
    are absorbed by the project conv's zero input weights: no slice is left."""
    blocks = [(16, 16), (None, 16), (16, 16), (16, 16), (None, 16)]
    report, got, ref = _run_padded(_inverted_residual(), blocks, monkeypatch)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    convs = report.details["per_conv"]
    assert [c["weight"] for c in convs] == [[32, 16, 1, 1], [32, 1, 3, 3], [16, 32, 1, 1], [32, 16, 1, 1],
                                            [16, 32, 1, 1]]
    assert convs[1]["groups"] == 32 and convs[1]["layouts"] == ["NCHW16c", "OIHW1i16o", "NCHW16c"]
    assert report.details["padding_slices"] == 0 and "into the convs reading it, 0 slice(s)" in report.summary
    mod, _ = _relax(_inverted_residual())
    laid, _ = alter_layouts(mod, scheduler_for(X86), search=PaddingSearch(blocks))
    assert "relax.strided_slice" not in _ops(laid)


def test_padding_meeting_an_unpadded_tensor_is_taken_back_before_it(monkeypatch):
    """A padded conv's output added to one that is not padded: the slice comes before the add,
    and the conv after it reads the real channels."""
    m = _model([_conv("x", "w1", None, "a"), _conv("x", "w2", None, "b"), helper.make_node("Add", ["a", "b"], ["s"]),
                _conv("s", "w3", None, "y")],
               [1, 16, 4, 4], {"w1": _w(20, 16, 1, 1), "w2": _w(20, 16, 1, 1), "w3": _w(16, 20, 1, 1)})

    class PadFirst(PaddingSearch):
        def decide(self, site, incoming, allowed_out=None, next_conv=None, pool=None, padding=None):
            if site.weight[0] == 20 and len(self.blocks) == 2:
                return FixedSearch.decide(self, site, incoming)
            return super().decide(site, incoming)

    mod, _ = _relax(m)
    laid, report = alter_layouts(mod, scheduler_for(X86), search=PadFirst([(16, 16), (16, 1), (1, 16)]))
    assert [c["weight"] for c in report.details["per_conv"]] == [[32, 16, 1, 1], [20, 16, 1, 1], [16, 20, 1, 1]]
    assert _ops(laid).count("relax.strided_slice") == 1
    assert report.details["padding_slices"] == 1


def test_search_and_rewrite_disagreeing_fall_back_to_padding_the_epilogue_only(monkeypatch):
    """Should the rewrite not follow the walk the layouts were scored on, the layouts are chosen
    again with padding stopping at each conv's epilogue, and the result is still right."""
    from packager.optimize.layout import pad

    monkeypatch.setattr(pad, "taken", lambda call, p: None)     # the rewrite's view only (padflow imported its own)
    blocks = [(16, 16), (None, 16), (16, 16), (16, 16), (None, 16)] + [(16, 16), (1, 1), (1, 16), (16, 16), (1, 16)]
    report, got, ref = _run_padded(_inverted_residual(), blocks, monkeypatch)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert [c["weight"][1] for c in report.details["per_conv"]] == [16, 1, 20, 8, 20]
    assert not report.details["padding_flowed"] and "walk and rewrite disagreed" in report.summary


DEPTHWISE = ConvSite((1, 20, 8, 8), (20, 1, 3, 3), (1, 1), (1,) * 4, (1, 1), 20, "float32")


class ReaderSearch(TableSearch):
    """As TableSearch, padding alone gaining nothing (1.0 either way); a depthwise reader is
    slow in NCHW (2.0) and fast in 16c blocks (0.5)."""

    def _score(self, site, data_block, out_block):
        if site.depthwise:
            return 0.5 if data_block == 16 and out_block > 1 else 2.0
        return 1.0 if site.out_channels == 20 or out_block == 16 else 9.0


def test_padding_that_flows_into_its_reader_is_charged_the_readers_time_not_a_slice(tmp_path):
    assert ReaderSearch(tmp_path / "a.json", 1.0).decide(SITE, 16).padded_from == 0
    d = ReaderSearch(tmp_path / "b.json", 1.0).decide(SITE, 16, padding=PadContext(flows=True, readers=(DEPTHWISE,)))
    assert (d.padded_from, d.out_block) == (20, 16)
    assert DEPTHWISE.reading(32) == replace(DEPTHWISE, data=(1, 32, 8, 8), weight=(32, 1, 3, 3), groups=32)
    assert SITE.reading(32).weight == (20, 32, 3, 3)
    grouped = ConvSite((1, 24, 8, 8), (24, 8, 3, 3), (1, 1), (1,) * 4, (1, 1), 3, "float32")
    assert grouped.reading(32) == replace(grouped, data=(1, 32, 8, 8), weight=(32, 8, 3, 3), groups=4)


def test_padding_after_a_square_root_is_taken_back_before_the_next_conv(monkeypatch):
    """A square root (or a power, or a division by a tensor) may turn the padded channels into
    NaN, which zero weights would not absorb (0 x NaN): the conv after it reads the real channels."""
    m = _model([_conv("x", "w1", "b1", "a"), helper.make_node("Relu", ["a"], ["r"]),
                helper.make_node("Sqrt", ["r"], ["s"]), _conv("s", "w2", None, "y")],
               [1, 16, 4, 4], {"w1": _w(20, 16, 1, 1), "b1": _w(20), "w2": _w(16, 20, 1, 1)})
    report, got, ref = _run_padded(m, [(16, 16), (1, 16)], monkeypatch)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert [c["weight"] for c in report.details["per_conv"]] == [[32, 16, 1, 1], [16, 20, 1, 1]]
    assert not Padding(3, 5, finite=False).finite and Padding(3, 5) != Padding(3, 5, finite=False)


def _grouped_block(groups: int):
    """RegNetY's block at 24 channels: 1x1 -> BatchNorm -> ReLU -> grouped 3x3 (`groups`) -> ReLU
    -> squeeze-excite (mean, 1x1 to 8, ReLU, 1x1 back to 24, sigmoid, multiply) -> 1x1."""
    nodes = [_conv("x", "we", None, "e"),
             helper.make_node("BatchNormalization", ["e", "s", "b", "mu", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["er"]), _conv("er", "wg", "bg", "g", group=groups, pads=[1] * 4),
             helper.make_node("Relu", ["g"], ["gr"]), helper.make_node("GlobalAveragePool", ["gr"], ["q"]),
             _conv("q", "ws1", None, "s1"), helper.make_node("Relu", ["s1"], ["s1r"]), _conv("s1r", "ws2", None, "s2"),
             helper.make_node("Sigmoid", ["s2"], ["gate"]), helper.make_node("Mul", ["gr", "gate"], ["m"]),
             _conv("m", "wp", None, "y")]
    inits = {"we": _w(24, 16, 1, 1), "s": _w(24) + 1, "b": _w(24), "mu": _w(24), "var": np.abs(_w(24)) + 0.5,
             "wg": _w(24, 24 // groups, 3, 3), "bg": _w(24), "ws1": _w(8, 24, 1, 1), "ws2": _w(24, 8, 1, 1),
             "wp": _w(16, 24, 1, 1)}
    return _model(nodes, [1, 16, 6, 6], inits)


def test_padded_channels_flow_into_a_grouped_conv_as_extra_zero_groups(monkeypatch):
    """24 channels padded to 32 before a conv in 3 groups of 8: it computes a fourth group with
    zero filters, its 32-channel output flows on through the SE block into the last conv, and no
    slice is left; in 2 groups of 12 the 8 padded channels are no whole group, and are taken back."""
    blocks = [(16, 16), (None, 16), (16, 16), (16, 16), (None, 16)]
    report, got, ref = _run_padded(_grouped_block(3), blocks, monkeypatch)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    convs = report.details["per_conv"]
    assert [c["weight"] for c in convs] == [[32, 16, 1, 1], [32, 8, 3, 3], [16, 32, 1, 1], [32, 16, 1, 1],
                                            [16, 32, 1, 1]]
    assert convs[1]["groups"] == 4 and convs[1]["layouts"] == ["NCHW16c", "OIHW1i16o", "NCHW16c"]
    assert report.details["padding_slices"] == 0 and report.details["padding_extra_groups"] == 1
    report, got, ref = _run_padded(_grouped_block(2), [(16, 16), (1, 1), (1, 16), (16, 16), (1, 16)], monkeypatch)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    grouped = report.details["per_conv"][1]
    assert grouped["data"][1] == 24 and grouped["groups"] == 2 and report.details["padding_extra_groups"] == 0
