"""The winograd pass: which convs are eligible, the rewrite (it computes what the direct conv
does, its epilogue fused into the output transform), the decision replayed from the tuning
database, and targets that are not timed keep every conv direct."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from packager.optimize import pipeline
from packager.optimize.schedule.measure.database import TuningDatabase
from packager.optimize.winograd import RECORD, Site, decide, rewrite, winograd_convs
from packager.optimize.winograd.compute import Geometry
from packager.spec import OptimizeSpec
from support.globalfuse_cases import run_module
from support.kernel_cases import _imported, case, host_target, scheduler, w


CONVS = 4


def _model():
    """conv 1x1 16 -> 16 (packs the layout), conv 3x3 16 -> 32 (+ bias, relu), conv 3x3 32 -> 32
    + residual (relu), conv 3x3 stride 2."""
    nodes = [helper.make_node("Conv", ["y", "w0", "b0"], ["y0"], pads=[1] * 4), helper.make_node("Relu", ["y0"], ["a"]),
             helper.make_node("Conv", ["a", "w1", "b1"], ["c"], pads=[1] * 4),
             helper.make_node("Add", ["c", "a"], ["d"]), helper.make_node("Relu", ["d"], ["e"]),
             helper.make_node("Conv", ["e", "w2"], ["z"], pads=[1] * 4, strides=[2, 2])]
    m = case("Conv", {"x": [1, 16, 10, 9]}, {}, {"w": w(16, 16, 1, 1)}, nodes)
    m.graph.initializer.extend([numpy_helper.from_array(a, n) for n, a in (
        ("w0", w(32, 16, 3, 3)), ("b0", w(32)), ("w1", w(32, 32, 3, 3)), ("b1", w(32)), ("w2", w(32, 32, 3, 3)))])
    return m


def _passes(mod, opt, first: str, last: str):
    """The CPU graph pipeline's passes from `first` ("": the first) up to (not including) `last`."""
    passes = pipeline.graph_passes(host_target())
    names = [p.name for p in passes]
    chosen = passes[names.index(first) if first else 0:names.index(last)]
    return pipeline.run_passes(mod, chosen, pipeline.PassContext(host_target(), opt))[0]


@pytest.mark.parametrize("m", [4, 2])
def test_rewrite_computes_the_direct_conv(m):
    opt = OptimizeSpec(level=2, measure=False)
    mod, _ = _imported(_model())
    laid = _passes(mod, opt, "", "winograd")
    out, done = rewrite(laid, lambda site: {"m": m})
    assert done.convs[m] >= 1 and done.skipped["strided, dilated or grouped"] == 1
    assert sum(done.convs.values()) + sum(done.skipped.values()) == CONVS - 1       # the 1x1 conv is not counted
    direct, wino = (_passes(x, opt, "legalize", "reuse") for x in (laid, out))
    fused = [gv.name_hint for gv, _ in wino.functions_items()]
    assert any(n.startswith("fused_winograd_output_add") for n in fused), fused   # bias / residual fused
    x = np.random.default_rng(1).standard_normal((1, 16, 10, 9)).astype(np.float32)
    ref = run_module(direct, x)
    np.testing.assert_allclose(run_module(wino, x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_direct_choice_leaves_the_module():
    opt = OptimizeSpec(level=2, measure=False)
    laid = _passes(_imported(_model())[0], opt, "", "winograd")
    out, done = rewrite(laid, lambda site: {"m": 0})
    assert set(done.convs) == {0}
    assert "winograd_input" not in [gv.name_hint for gv, _ in out.functions_items()]


def test_decision_replayed_from_the_database(tmp_path, monkeypatch):
    sched = scheduler(host_target(), database=tmp_path)
    site = Site(Geometry(1, 32, 32, 14, 14, 14, 14, 1, 1, 0), 16, 16, (16, 16), np.zeros((32, 32, 3, 3), np.float32))
    db = TuningDatabase(tmp_path)
    db.put(site.key(sched.target_key()), {"m": 4, "direct_ms": 1.0, "f4_ms": 0.5, "f2_ms": 0.7, "measured": True},
           RECORD, sched.target_key())

    def not_timed(*args, **kwargs):
        raise AssertionError("a recorded decision is not timed again")

    monkeypatch.setattr(type(sched), "time_chains", not_timed)
    assert decide(site, sched, db)["m"] == 4


def test_untimed_target_keeps_every_conv_direct():
    mod = _passes(_imported(_model())[0], OptimizeSpec(level=2, measure=False), "", "winograd")
    out, report = winograd_convs(mod, scheduler(host_target(), measure=False))
    assert report.status == "disabled" and out is mod


@pytest.mark.parametrize("f4,f2,chosen", [((0.3, 0.4, 0.25), (0.5, 0.3, 0.2), 0),     # 0.95 and 1.0: within the margin
                                          ((0.3, 0.4, 0.25), (0.4, 0.3, 0.15), 2),    # 0.85
                                          ((0.2, 0.3, 0.1), (0.4, 0.3, 0.15), 4)])
def test_winograd_is_chosen_only_past_the_margin(tmp_path, monkeypatch, f4, f2, chosen):
    """Each kernel timed as built (direct: 1 ms); a Winograd tile wins only below MARGIN x direct."""
    sched = scheduler(host_target(), database=tmp_path)
    site = Site(Geometry(1, 32, 32, 14, 14, 14, 14, 1, 1, 0), 16, 16, (16, 16), np.zeros((32, 32, 3, 3), np.float32))

    class Searcher:
        def schedule(self, func, name):
            return func, "stub", None

    monkeypatch.setattr(type(sched), "searcher", lambda self, *a, **k: Searcher())
    monkeypatch.setattr(type(sched), "time_chains", lambda self, chains: [s / 1e3 for s in (1.0, sum(f4), sum(f2))])
    record = decide(site, sched, TuningDatabase(tmp_path))
    assert record["m"] == chosen and record["f4_ms"] == pytest.approx(sum(f4))
