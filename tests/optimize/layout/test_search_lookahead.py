"""The layout search's decisions (search.py): a conv that one conv alone reads chooses its output
block with that conv's cost (one step of ALT's joint search), recorded apart from greedy choices."""
from __future__ import annotations

import numpy as np
from onnx import helper

from packager.optimize.schedule.registry import scheduler_for
from packager.spec import OptimizeSpec
from packager.optimize.layout.clip import clip_as_ops
from packager.optimize.layout.propagate import _Tracker, bindings, alter_layouts
from packager.optimize.layout.search import LOOKAHEAD_WITHIN, LayoutSearch
from packager.optimize.layout.sites import ConvSite, NextConv

from test_propagate import X86, _conv, _model, _relax, _w

EXPAND = ConvSite((1, 16, 8, 8), (96, 16, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, "float32")
DEPTHWISE = ConvSite((1, 96, 8, 8), (96, 1, 3, 3), (1, 1), (1,) * 4, (1, 1), 96, "float32")

# ms per (conv, data block, output block): the expand conv alone prefers a plain NCHW output, and
# the depthwise conv reading NCHW is 5x slower than reading 16-channel blocks (MobileNetV2's case)
TABLE = {(EXPAND, 16, 1): 1.0, (EXPAND, 16, 16): 1.2, (EXPAND, 16, 32): 1.3,
         (DEPTHWISE, 1, 1): 3.0, (DEPTHWISE, 1, 16): 2.5, (DEPTHWISE, 1, 32): 2.6,
         (DEPTHWISE, 16, 1): 2.0, (DEPTHWISE, 16, 16): 0.5, (DEPTHWISE, 16, 32): 0.6,
         (DEPTHWISE, 32, 1): 2.0, (DEPTHWISE, 32, 16): 0.7, (DEPTHWISE, 32, 32): 0.55}


class TableSearch(LayoutSearch):
    """The real decisions over scores from TABLE (no timing); converting the depthwise conv's
    input costs 3 ms; `scored` lists the candidates asked for. 16 fp32 lanes (AVX-512) whatever
    the host has, as TABLE's blocks are."""

    def __init__(self, database, table=TABLE):
        super().__init__(scheduler_for(X86, OptimizeSpec(database=database, measure=False)))
        self.lanes = 16
        self.table, self.scored = table, []

    def _conversion_ms(self, site: ConvSite, src: int, dst: int) -> float:
        return 0.0 if src == dst else 3.0 * int(np.prod(site.data)) / (96 * 8 * 8)

    def _score(self, site: ConvSite, data_block: int, out_block: int) -> float:
        self.scored.append((site, data_block, out_block))
        return self.table[(site, data_block, out_block)]


def test_the_next_conv_decides_the_output_block(tmp_path):
    """Alone the expand conv would write NCHW (1.0 ms); with the depthwise conv's best time per
    block it writes 16-channel blocks (1.2 + 0.5 < 1.0 + 2.5)."""
    greedy = TableSearch(tmp_path / "a").decide(EXPAND, 16)
    assert greedy.out_block == 1 and not greedy.ahead and not greedy.changed_by_lookahead
    d = TableSearch(tmp_path / "b").decide(EXPAND, 16, None, NextConv(DEPTHWISE))
    assert (d.data_block, d.out_block) == (16, 16)
    assert d.ahead == {"1": 2.5, "16": 0.5, "32": 0.55}
    assert d.changed_by_lookahead


def test_blocks_clearly_slower_alone_are_not_looked_ahead_for(tmp_path):
    """An output block whose own time is over LOOKAHEAD_WITHIN x the best costs no timing of
    the next conv."""
    table = {**TABLE, (EXPAND, 16, 32): 1.0 * LOOKAHEAD_WITHIN + 0.1}
    search = TableSearch(tmp_path, table)
    d = search.decide(EXPAND, 16, None, NextConv(DEPTHWISE))
    assert set(d.ahead) == {"1", "16"}
    assert not any(site == DEPTHWISE and data == 32 for site, data, _ in search.scored)


def test_a_looked_ahead_decision_is_recorded_apart_and_replayed(tmp_path):
    first = TableSearch(tmp_path)
    first.decide(EXPAND, 16, None, NextConv(DEPTHWISE))
    first.save()
    again = TableSearch(tmp_path)
    d = again.decide(EXPAND, 16, None, NextConv(DEPTHWISE))
    assert d.reused and d.out_block == 16 and d.ahead and not again.scored
    assert again.decide(EXPAND, 16).out_block == 1            # the greedy key is another record


def _mobilenet_block(c: int = 16, e: int = 96):
    return _model([_conv("x", "we", "be", "e"), helper.make_node("Clip", ["e", "lo", "hi"], ["e6"]),
                   _conv("e6", "wd", "bd", "d", pads=[1] * 4, group=e), helper.make_node("Clip", ["d", "lo", "hi"], ["d6"]),
                   _conv("d6", "wp", "bp", "p"), helper.make_node("Add", ["p", "x"], ["y"])],
                  [1, c, 8, 8], {"we": _w(e, c, 1, 1), "be": _w(e), "wd": _w(e, 1, 3, 3), "bd": _w(e),
                                 "wp": _w(c, e, 1, 1), "bp": _w(c), "lo": np.array(0, np.float32),
                                 "hi": np.array(6, np.float32)})


def test_only_memory_bound_convs_are_looked_ahead_to():
    """A depthwise conv (9 products per output) and a 1x1 conv from 16 channels (16) stream their
    input; a projection from 96 channels and a 3x3 conv over 16 (144) amortize its layout."""
    project = ConvSite((1, 96, 8, 8), (16, 96, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, "float32")
    conv3x3 = ConvSite((1, 16, 8, 8), (16, 16, 3, 3), (1, 1), (1,) * 4, (1, 1), 1, "float32")
    assert DEPTHWISE.memory_bound and EXPAND.memory_bound
    assert not project.memory_bound and not conv3x3.memory_bound


def test_the_tracker_finds_the_conv_that_alone_reads_a_conv():
    """expand -> clip -> depthwise -> clip -> project: the expand conv's reader is the depthwise
    conv and the depthwise conv's the projection; the projection's output meets the block input in
    an add (no conv reads it), and a tensor two convs read has no single next conv."""
    mod, _ = clip_as_ops(_relax(_mobilenet_block())[0])      # as the layout pass sees it
    track = _Tracker(mod)
    convs = [b for b in bindings(mod) if getattr(getattr(b.value, "op", None), "name", "") == "relax.nn.conv2d"]
    nxt = [track.next_conv(b.var) for b in convs]
    assert nxt[0].var.same_as(convs[1].var) and nxt[1].var.same_as(convs[2].var) and nxt[2] is None
    branches, _ = _relax(_model([_conv("x", "w1", None, "a"), _conv("a", "w2", None, "b"), _conv("a", "w3", None, "c"),
                                 helper.make_node("Add", ["b", "c"], ["y"])],
                                [1, 16, 6, 6], {"w1": _w(16, 16, 1, 1), "w2": _w(16, 16, 1, 1), "w3": _w(16, 16, 1, 1)}))
    first = next(b for b in bindings(branches) if getattr(getattr(b.value, "op", None), "name", "") == "relax.nn.conv2d")
    assert _Tracker(branches).next_conv(first.var) is None


def test_the_layout_pass_reports_the_lookahead_and_stays_correct(tmp_path):
    """On a MobileNet block the pass looks ahead from the expand conv to the depthwise conv (not
    from the depthwise conv to the projection, which reduces over 96 channels), the expand conv
    writes 16-channel blocks although NCHW was faster alone, the report says so, and the
    re-laid-out graph computes what onnxruntime computes."""
    import onnxruntime as ort
    import tvm
    from tvm import relax

    from packager.optimize.layout.conv import legalize_conv2d
    from packager.optimize.relax_util import legalize

    project = ConvSite((1, 96, 8, 8), (16, 96, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, "float32")
    table = {**TABLE, **{(project, i, o): 1.0 for i in (1, 16, 32) for o in (1, 16, 32)},
             **{(EXPAND, 1, o): 5.0 for o in (1, 16, 32)}}
    model = _mobilenet_block()
    mod, shape = _relax(model)
    laid, report = alter_layouts(mod, scheduler_for(X86), search=TableSearch(tmp_path, table))
    assert report.details["lookahead"] == {"convs": 1, "changed": 1}, report.summary
    assert "1 convs chose their output block with the cost of the conv reading it, 1 of them" in report.summary
    assert report.details["per_conv"][1]["next_conv_ms"] == {}
    assert report.details["per_conv"][0]["layouts"][2] == "NCHW16c"
    built = relax.build(legalize(laid, {"relax.nn.conv2d": legalize_conv2d}), target="llvm")
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got = relax.VirtualMachine(built, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_the_tracker_follows_activations_that_read_the_conv_twice():
    """SiLU exported as x * sigmoid(x) and HardSwish as x * HardSigmoid(x) read the expand conv's
    output twice; the depthwise conv is still the one reader (EfficientNet and MobileNetV3 lost
    the lookahead). A branch that leads to a second reader (the conv output also added to the
    graph output) has none."""
    def block(act, extra=False):
        nodes = [_conv("x", "we", None, "e")] + act + [_conv("a", "wd", None, "d", pads=[1] * 4, group=32)]
        nodes.append(helper.make_node("Add", ["d", "e"] if extra else ["d", "d"], ["y"]))
        return _relax(_model(nodes, [1, 16, 8, 8], {"we": _w(32, 16, 1, 1), "wd": _w(32, 1, 3, 3)}))[0]

    silu = [helper.make_node("Sigmoid", ["e"], ["s"]), helper.make_node("Mul", ["e", "s"], ["a"])]
    hswish = [helper.make_node("HardSigmoid", ["e"], ["s"], alpha=1 / 6, beta=0.5),
              helper.make_node("Mul", ["e", "s"], ["a"])]
    for act, extra, found in ((silu, False, True), (hswish, False, True), (silu, True, False)):
        mod, _ = clip_as_ops(block(act, extra))
        track = _Tracker(mod)
        convs = [b for b in bindings(mod) if getattr(getattr(b.value, "op", None), "name", "") == "relax.nn.conv2d"]
        nxt = track.next_conv(convs[0].var)
        assert (nxt is not None and nxt.var.same_as(convs[1].var)) == found


def test_a_conv_with_a_transcendental_epilogue_is_scored_with_it():
    """The SiLU after a conv is part of its kernel, and its cost depends on the layout (over an
    NCHW output 14 wide LLVM computed it one lane at a time): the site carries it, its key
    differs from the bare conv's, and its scored kernel computes it."""
    silu = _relax(_model([_conv("x", "we", None, "e"), helper.make_node("Sigmoid", ["e"], ["s"]),
                          helper.make_node("Mul", ["e", "s"], ["y"])], [1, 16, 8, 8], {"we": _w(32, 16, 1, 1)}))[0]
    relu = _relax(_model([_conv("x", "we", None, "e"), helper.make_node("Relu", ["e"], ["y"])],
                         [1, 16, 8, 8], {"we": _w(32, 16, 1, 1)}))[0]
    got = []
    for mod in (silu, relu):
        track = _Tracker(mod)
        conv = next(b for b in bindings(mod) if getattr(getattr(b.value, "op", None), "name", "") == "relax.nn.conv2d")
        got.append(track.epilogue(conv.var))
    assert got == ["silu", ""]
    site = ConvSite((1, 16, 8, 8), (32, 16, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, "float32", "silu")
    bare = ConvSite((1, 16, 8, 8), (32, 16, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, "float32")
    assert site.key() != bare.key() and site.class_key() != bare.class_key()
    assert "T_silu" in site.kernel(16, 16).script() and "T_silu" not in bare.kernel(16, 16).script()
