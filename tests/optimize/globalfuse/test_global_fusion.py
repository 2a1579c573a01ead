"""Global fusion (Souffle) on the transformer sample: layout copies fold into the kernels that
read them, the Q/K/V projections become one matmul on weights concatenated at build time, the
module computes the same, and the report counts what changed."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from packager.frontend import bind_profiles, import_relax, load_model, profile_shapes
from packager.optimize.globalfuse import combine_siblings
from packager.optimize.globalfuse.analyze import te_summary
from packager.optimize.globalfuse.graph import kernel_graph
from packager.optimize.globalfuse.phases import MAX_PHASES
from packager.optimize.schedule.phases import phase_sizes, phase_threads, split_phases, thread_shape
from packager.optimize.globalfuse.trial import TrialRules, keeps_schedule
from packager.optimize.globalfuse.vertical import is_layout_only, layout_kernels
from packager.optimize.pipeline import PassContext, optimize_graph
from packager.optimize.simplify import simplify
from packager.spec import OptimizeSpec, load_spec
from packager.targets import resolve_all
from support.kernel_cases import CASES, kernels_of


@pytest.fixture(scope="module")
def transformer(sample_root):
    spec = load_spec(sample_root / "transformer" / "spec.yaml")
    model = load_model(spec.model)
    dtypes = bind_profiles(spec, model)
    mod = import_relax(model, profile_shapes(model, spec.profiles[0]), dtypes)[0]
    return spec, mod, resolve_all(spec)[0]


def _optimized(transformer, target=None, measure=False, database=None, **passes):
    spec, mod, spec_target = transformer
    opt = OptimizeSpec(level=2, passes=passes, measure=measure, database=database)
    return optimize_graph(mod, opt, target or spec_target)


def _report(reports, name):
    return next(r for r in reports if r.name == name)


@pytest.fixture(scope="module")
def h100():
    from packager.spec import TargetSpec
    from packager.targets import resolve

    return resolve(TargetSpec("h100", {}, "test"))


def test_layout_copies_fold_and_qkv_combine_on_a_gpu_target(transformer, h100):
    fused, reports = _optimized(transformer, h100)
    alone, alone_reports = _optimized(transformer, h100, global_fusion=False)
    gf = _report(reports, "global_fusion")
    assert gf.status == "applied"
    assert _report(alone_reports, "global_fusion").status == "disabled"
    n_alone = len(kernel_graph(alone).calls)
    n_fused = len(kernel_graph(fused).calls)
    assert n_alone == 15 and n_fused <= 0.6 * n_alone, gf.summary
    assert gf.details["kernels_after"] == n_fused
    assert gf.details["horizontal"] == {"groups": 1, "matmuls": 3, "conv_groups_left": 0}
    assert layout_kernels(kernel_graph(fused)) == set()            # no copy kernel left
    assert gf.details["dram_bytes_after"] < gf.details["dram_bytes_before"]
    assert "sibling matmuls combined: 3 -> 1" in gf.summary
    assert "CPU targets only" in gf.summary                       # row regions: CPU only


def test_gpu_chains_become_phased_kernels(transformer, h100):
    """Chains of kernels (each read only by the next) merge into phased kernels, and only where
    every phase keeps one block shape (no thread of the cooperative kernel idles)."""
    fused, reports = _optimized(transformer, h100)
    gf = _report(reports, "global_fusion")
    chains = gf.details["grid_phases"]["chains"]
    assert chains and all(2 <= len(c) <= MAX_PHASES for c in chains), gf.summary
    assert f"{len(chains)} chain(s)" in gf.summary
    called = {c.func.name_hint: c.prim for c in kernel_graph(fused).calls.values()}
    phased = [f for f in called.values() if phase_sizes(f)]
    assert len(phased) == len({tuple(c) for c in chains}), gf.summary   # identical chains share a kernel
    rules = TrialRules(h100)
    for f in phased:
        phases, _ = split_phases(f, phase_sizes(f))
        assert len({thread_shape(rules.gpu_schedule(p, phase_threads(f))[0]) for p in phases}) == 1
    assert gf.details["kernels_after"] < gf.details["kernels_before"]


def test_cpu_targets_take_no_grid_phases(transformer):
    _, reports = _optimized(transformer)
    assert "GPU targets only" in _report(reports, "global_fusion").details["grid_phases"]["skipped"]


def test_cpu_target_takes_row_regions_and_no_unmeasured_folds(transformer):
    fused, reports = _optimized(transformer)                       # x86-64, measuring off
    gf = _report(reports, "global_fusion")
    assert gf.details["row_regions"]["taken"] == 1                 # softmax into P @ V
    assert gf.details["row_regions"]["with_matmul"] == 1           # and the scores Q @ K^T before it
    assert gf.details["layout_folded"] == 0 and "not tried" in gf.details["layout_note"]
    assert "not measured" in gf.summary


def test_cpu_folds_only_what_is_not_measured_slower(transformer, tmp_path):
    """Every merged kernel taken was measured faster than its parts or tied with them within the
    timer's resolution (times are reported rounded to 0.1 us)."""
    from packager.optimize.globalfuse.timing import pays

    _, reports = _optimized(transformer, measure=True, database=tmp_path)
    d = _report(reports, "global_fusion").details
    for m in d["measured"] + d["row_regions"]["measured"]:
        assert pays(m["fused_us"] - 0.05, m["separate_us"] + 0.05), m
    for why in list(d["refused"].values()) + list(d["row_regions"]["refused"].values()):
        assert "slower when measured" in why or "when fused" in why or "row-region" in why, why


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("where", ["x86-64", "h100"])
def test_fused_module_computes_the_same(transformer, h100, where):
    """The merged graph (unscheduled kernels, run on this CPU) against FuseOps alone: on h100
    the copies fold, Q/K/V combine and chains become phased kernels, on x86-64 the softmax joins
    P @ V."""
    x = np.random.default_rng(1).standard_normal((1, 32, 64)).astype(np.float32)
    target = h100 if where == "h100" else None
    fused, _ = _optimized(transformer, target)
    alone, _ = _optimized(transformer, target, global_fusion=False)
    np.testing.assert_allclose(_run(fused, x), _run(alone, x), rtol=1e-5, atol=1e-5)


def _weights_read_by_matmuls_of_tokens(mod) -> list[np.ndarray]:
    return [b.value.args[1].value.numpy() for b in mod["main"].body.blocks[0].bindings
            if getattr(getattr(b.value, "op", None), "name", "") == "relax.matmul" and b.value.args[0].name == "tokens"]


def test_combined_weight_is_the_concatenation(transformer):
    spec, mod, _ = transformer
    simple, _ = simplify(mod)
    originals = _weights_read_by_matmuls_of_tokens(simple)
    ctx = PassContext(None, OptimizeSpec(level=2))
    combined, _ = combine_siblings(simple, ctx)
    weights = _weights_read_by_matmuls_of_tokens(combined)
    assert len(originals) == 3 and len(weights) == 1
    np.testing.assert_array_equal(weights[0], np.concatenate(originals, axis=1))
    assert ctx.notes["horizontal"] == {"groups": 1, "matmuls": 3, "conv_groups_left": 0}


def test_two_heads_without_bias_combine_and_compute_the_same():
    """LeViT's two classifier heads (dynamo export: bias-free Gemms on one pooled tensor, summed)
    made the combiner fail on a rebuilt call whose type was never populated."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 384), "float32"))
    w1, w2 = (relax.const(rng.standard_normal((384, 100)).astype(np.float32)) for _ in range(2))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, w1))
            b = bb.emit(relax.op.matmul(x, w2))
            out = bb.emit_output(relax.op.add(a, b))
        bb.emit_func_output(out)
    mod = bb.get()
    ctx = PassContext(None, OptimizeSpec(level=2))
    combined, _ = combine_siblings(mod, ctx)
    assert ctx.notes["horizontal"]["groups"] == 1
    feed = rng.standard_normal((1, 384)).astype(np.float32)
    np.testing.assert_allclose(_run(combined, feed), _run(mod, feed), rtol=1e-5, atol=1e-4)


def test_layout_only_means_a_plain_copy():
    assert all(is_layout_only(f) for f in kernels_of(CASES["transpose"]).values())
    for name in ("matmul_odd", "add_broadcast", "softmax_last", "conv3x3"):
        assert not any(is_layout_only(f) for f in kernels_of(CASES[name]).values()), name
    x = relax.Var("x", relax.TensorType((10, 4), "float32"))
    i = relax.Var("i", relax.TensorType((3,), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, i]):
        out = bb.emit(relax.op.take(x, i, axis=0))
        bb.emit_func_output(out)
    gather = relax.transform.LegalizeOps()(bb.get())
    prim = next(f for _, f in gather.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    assert not is_layout_only(prim)                               # a gather reads data-dependent indices


def test_analysis_classifies_tensor_expressions(transformer):
    alone, _ = _optimized(transformer, global_fusion=False)
    s = te_summary(kernel_graph(alone))
    assert s.tes == s.one_to_one + s.one_to_many
    assert s.one_to_many >= 6            # 6 matmuls + softmax and layer norm reductions
    assert 1 <= s.compute_intensive <= s.one_to_many
    assert s.layout_only >= 4


def test_trial_refuses_a_fusion_that_loses_the_schedule():
    assert keeps_schedule("tiled-reduction", "tiled-reduction")
    assert not keeps_schedule("tiled-reduction", "fallback")
    assert not keeps_schedule("injective", "tiled-reduction")
    assert keeps_schedule("naive", "injective")
    assert not keeps_schedule("naive", "naive")


def test_the_input_module_is_left_alone(transformer):
    """Targets and profiles share one imported module: the pass must not change it."""
    spec, mod, target = transformer
    simple, _ = simplify(mod)
    before = simple.script()
    combine_siblings(simple, PassContext(None, OptimizeSpec(level=2)))
    assert simple.script() == before
    alone, _ = _optimized(transformer, global_fusion=False)
    before = alone.script()
    from packager.optimize.globalfuse import global_fusion
    global_fusion(alone, PassContext(target, OptimizeSpec(level=2, measure=False)))
    assert alone.script() == before


def test_row_region_decisions_come_back_from_the_tuning_database(transformer, tmp_path):
    """The first build times the merged softmax @ V against its parts and records it; a rebuild
    takes the recorded decision (here flipped by hand) instead of timing again."""
    import json

    _, reports = _optimized(transformer, measure=True, database=tmp_path)
    rows = _report(reports, "global_fusion").details["row_regions"]
    db = tmp_path / "tuning.json"
    data = json.loads(db.read_text())
    recs = [r for r in data["records"].values() if "fused_s" in r]
    assert len(recs) >= 1 + len(_report(reports, "global_fusion").details["measured"])
    # only the row regions' decisions flip: a flipped copy fold would change the kernels around them
    for r in (r for r in recs if r["fusion"] == "row region"):
        r["fused_s"], r["separate_s"] = (2.0, 1.0) if rows["taken"] else (1.0, 2.0)
    db.write_text(json.dumps(data))
    _, again = _optimized(transformer, measure=True, database=tmp_path)
    flipped = _report(again, "global_fusion").details["row_regions"]
    assert flipped["taken"] == 1 - rows["taken"]
    if rows["taken"]:
        assert list(flipped["refused"].values()) == ["slower when measured: 2000000 vs 1000000 us"]


def test_decisions_of_older_rules_are_measured_again(transformer, tmp_path, monkeypatch):
    """A recorded decision is keyed by DECISIONS_VERSION: after a rule change (the version
    bumped) the rebuild times the merged kernels again instead of replaying the old decision."""
    import json

    from packager.optimize.globalfuse import timing

    _optimized(transformer, measure=True, database=tmp_path)
    db = tmp_path / "tuning.json"
    data = json.loads(db.read_text())
    old = {k: r for k, r in data["records"].items() if "fused_s" in r}
    assert old
    for r in old.values():
        r["fused_s"], r["separate_s"] = 2.0, 1.0                 # a stale "refused" for everything
    db.write_text(json.dumps(data))
    monkeypatch.setattr(timing, "DECISIONS_VERSION", timing.DECISIONS_VERSION + 1)
    _, again = _optimized(transformer, measure=True, database=tmp_path)
    details = _report(again, "global_fusion").details
    reasons = [*details["row_regions"]["refused"].values(), *details["refused"].values()]
    assert not any("2000000 vs 1000000" in why for why in reasons)
    fresh = {k for k, r in json.loads(db.read_text())["records"].items() if "fused_s" in r} - set(old)
    assert fresh                                   # timed again: new records, under the new version


def test_a_measured_tie_goes_to_the_merged_kernel():
    """Within the timer's resolution the merged kernel (fewer bytes, one step less) is kept;
    beyond it the measurement refuses."""
    from packager.optimize.globalfuse.timing import TIMER_RESOLUTION, pays

    assert pays(0.9, 1.0) and pays(1.0, 1.0) and pays(1.0 + TIMER_RESOLUTION / 2, 1.0)
    assert not pays(1.0 + 2 * TIMER_RESOLUTION, 1.0) and not pays(2.0, 1.0)


def test_sibling_convs_are_reported_as_left_apart():
    """Two 1x1 convs reading one tensor (Inception branches): not combined (TVM 0.27 has no
    CombineParallelConv2D), and the report says so."""
    from onnx import helper

    from packager.frontend import LoadedModel, TensorInfo
    from support.kernel_cases import case, w

    m = case("Conv", {"x": [1, 8, 6, 6]}, {}, {"w1": w(4, 8, 1, 1)})
    m.graph.node.extend([helper.make_node("Conv", ["x", "w2"], ["y2"]), helper.make_node("Add", ["y", "y2"], ["z"])])
    m.graph.initializer.append(helper.make_tensor("w2", 1, [4, 8, 1, 1], w(4, 8, 1, 1).ravel().tolist()))
    m.graph.output[0].name = "z"
    inputs = [TensorInfo("x", "float32", (1, 8, 6, 6))]
    mod, _ = import_relax(LoadedModel(None, m, 17, inputs, [TensorInfo("z", "float32", ())]),
                          {"x": (1, 8, 6, 6)}, {"x": "float32"})
    ctx = PassContext(None, OptimizeSpec(level=2))
    combine_siblings(simplify(mod)[0], ctx)
    assert ctx.notes["horizontal"]["conv_groups_left"] == 1


def test_cpu_layout_chains_store_each_copy_once(transformer):
    """The head split and the copies of its outputs (Q's and V's reshapes, K's transposes)
    become one layout kernel; nothing else reads the values in between."""
    fused, reports = _optimized(transformer)
    chains = _report(reports, "global_fusion").details["layout_chains"]
    assert chains["taken"] == 1 and chains["absorbed"] == 3, chains
    g = kernel_graph(fused)
    layout = layout_kernels(g)
    assert len(layout) == 2                                       # the merged split, the heads' merge
    for i in layout:                                              # no copy of a copy is left
        assert not any(j in layout for j in g.call_inputs(i)), g.calls[i].name


@pytest.mark.parametrize("tokens,taken", [(64, 1), (37, 0)])
def test_untimed_attention_regions_need_whole_tiles(tokens, taken):
    """Where the target is not timed, the scores matmul joins the region only when no tile is
    partial (ViT's 197 tokens measured 8x slower merged on x86)."""
    from types import SimpleNamespace

    from packager.optimize.globalfuse.rowregion import row_regions
    from support.kernel_cases import host_target, optimized_module, scores_attention

    target = host_target()
    mod = optimized_module(scores_attention(tokens, tokens, 16), target, global_fusion=False)
    out, rows = row_regions(mod, SimpleNamespace(target=target), TrialRules(target), None)
    assert rows.taken == 1 and rows.with_matmul == taken, rows
    assert len(kernel_graph(out).calls) == 2 - taken
    if not taken:
        assert any("predicated" in why for why in rows.refused.values()), rows.refused
