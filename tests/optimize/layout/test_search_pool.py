"""The layout search's pooling term (search.py): a conv whose output one pooling alone reads
chooses its output block with the pooling's time in that block (ResNet's stem -> relu -> max
pool), recorded apart from the choice without it."""
from __future__ import annotations

import numpy as np
import tvm
from onnx import helper

from packager.optimize.schedule.registry import scheduler_for
from packager.spec import OptimizeSpec
from packager.optimize.layout.clip import clip_as_ops
from packager.optimize.layout.propagate import _Tracker, bindings, alter_layouts
from packager.optimize.layout.search import LayoutSearch
from packager.optimize.layout.sites import ConvSite, PoolSite

from test_propagate import X86, _conv, _model, _relax, _w

STEM = ConvSite((1, 3, 16, 16), (16, 3, 3, 3), (1, 1), (1,) * 4, (1, 1), 1, "float32")
POOL = PoolSite((1, 16, 16, 16), "max", (3, 3), (2, 2), (1,) * 4, (1, 1), False, False, "float32")

# the stem alone prefers NCHW by 5%, its max pool runs 3x faster over channel blocks
# (16 channels: no 32-channel blocks)
TABLE = {(STEM, 1, 1): 1.0, (STEM, 1, 16): 1.05}
POOL_MS = {1: 0.3, 16: 0.1}


class TableSearch(LayoutSearch):
    """The real decisions over TABLE's conv scores and POOL_MS's pooling times (no timing)."""

    def __init__(self, database):
        super().__init__(scheduler_for(X86, OptimizeSpec(database=database, measure=False)))
        self.pools = []

    def _score(self, site, data_block, out_block):
        return TABLE.get((site, data_block, out_block), 9.0)

    def _score_pool(self, pool, block):
        self.pools.append((pool, block))
        return POOL_MS[block]


def test_the_pooling_decides_the_output_block(tmp_path):
    """Alone the stem writes NCHW (1.0 ms); with its pooling, 16-channel blocks (1.05 + 0.1 <
    1.0 + 0.3); the pooling's times are kept with the decision."""
    alone = TableSearch(tmp_path / "a").decide(STEM, 1)
    assert alone.out_block == 1 and not alone.pool and not alone.changed_by_lookahead
    d = TableSearch(tmp_path / "b").decide(STEM, 1, None, None, POOL)
    assert (d.data_block, d.out_block) == (1, 16)
    assert d.pool == {"1": 0.3, "16": 0.1}
    assert d.changed_by_lookahead


def test_a_pooled_decision_is_recorded_apart_and_replayed(tmp_path):
    first = TableSearch(tmp_path)
    first.decide(STEM, 1, None, None, POOL)
    first.save()
    again = TableSearch(tmp_path)
    d = again.decide(STEM, 1, None, None, POOL)
    assert d.reused and d.out_block == 16 and d.pool and not again.pools
    assert again.decide(STEM, 1).out_block == 1              # the key without the pooling is another record


def test_the_pooling_kernel_computes_the_pooling_in_each_block():
    """PoolSite.kernel over NCHW, NCHW8c and NCHW16c equals numpy's max pool (padding included)
    and is scheduled by Gensor (a finite estimate)."""
    x = np.random.default_rng(0).standard_normal(POOL.data).astype(np.float32)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    ref = np.stack([padded[:, :, i:i + 15:2, j:j + 15:2] for i in range(3) for j in range(3)]).max(0)
    for block in (1, 8, 16):
        lib = tvm.compile(POOL.kernel(block), target="llvm")
        xb = x if block == 1 else x.reshape(1, 16 // block, block, 16, 16).transpose(0, 1, 3, 4, 2).copy()
        out = tvm.runtime.tensor(np.zeros((1, 16 // block, 8, 8, block) if block > 1 else ref.shape, np.float32))
        lib(tvm.runtime.tensor(xb), out)
        got = out.numpy() if block == 1 else out.numpy().transpose(0, 1, 4, 2, 3).reshape(ref.shape)
        np.testing.assert_array_equal(got, ref)
    assert np.isfinite(LayoutSearch(scheduler_for(X86, OptimizeSpec(measure=False)))._score_pool(POOL, 16))


def _stem(readers: int = 2):
    """conv -> relu -> max pool -> `readers` convs (added), ResNet's stem and first block."""
    tail = [_conv("p", "w2", None, "b")] + ([_conv("p", "w3", None, "c"), helper.make_node("Add", ["b", "c"], ["y"])]
                                            if readers == 2 else [helper.make_node("Relu", ["b"], ["y"])])
    return _model([_conv("x", "w1", "b1", "a", pads=[1] * 4), helper.make_node("Relu", ["a"], ["r"]),
                   helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)] + tail,
                  [1, 3, 16, 16], {"w1": _w(16, 3, 3, 3), "b1": _w(16), "w2": _w(16, 16, 1, 1), "w3": _w(16, 16, 1, 1)})


def test_the_tracker_finds_the_pooling_that_alone_reads_a_conv():
    """stem -> relu -> max pool: the stem's pooling is found (with its attributes); the convs
    after the pool have none; a conv read by a pooling and by another op has none."""
    mod, _ = clip_as_ops(_relax(_stem())[0])
    track = _Tracker(mod)
    convs = [b for b in bindings(mod) if getattr(getattr(b.value, "op", None), "name", "") == "relax.nn.conv2d"]
    pool = track.pool_after(convs[0].var)
    assert pool is not None and PoolSite.of(pool.value) == POOL
    assert all(track.pool_after(b.var) is None for b in convs[1:])
    shared, _ = _relax(_model([_conv("x", "w1", None, "a"), helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[3, 3],
                                                                                pads=[1] * 4),
                               helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Add", ["p", "r"], ["y"])],
                              [1, 16, 6, 6], {"w1": _w(16, 16, 1, 1)}))
    first = next(b for b in bindings(shared) if getattr(getattr(b.value, "op", None), "name", "") == "relax.nn.conv2d")
    assert _Tracker(shared).pool_after(first.var) is None


def test_the_layout_pass_reports_the_pooling_and_stays_correct(tmp_path):
    """On a stem with a max pool read by two convs the stem writes 16-channel blocks although
    NCHW was faster alone, the report says so, and the graph computes what onnxruntime does."""
    import onnxruntime as ort
    from tvm import relax

    from packager.optimize.layout.conv import legalize_conv2d
    from packager.optimize.relax_util import legalize

    model = _stem()
    mod, shape = _relax(model)
    laid, report = alter_layouts(mod, scheduler_for(X86), search=TableSearch(tmp_path))
    assert report.details["pooling"] == {"convs": 1, "changed": 1}, report.summary
    assert "1 convs chose their output block with the time of the pooling after them, 1 of them" in report.summary
    assert report.details["per_conv"][0]["layouts"][2] == "NCHW16c"
    assert report.details["per_conv"][0]["pool_ms"] == POOL_MS_STR
    built = relax.build(legalize(laid, {"relax.nn.conv2d": legalize_conv2d}), target="llvm")
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got = relax.VirtualMachine(built, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


POOL_MS_STR = {str(k): v for k, v in POOL_MS.items()}
