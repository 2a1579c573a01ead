"""ETO's bridge operators: the 1-hop candidates, the greedy Steiner tree (never costlier than the
arborescence without bridges, a bridge only where it joins kernels), and bridge kernels that
have their source's sketch and compute their own multiply-accumulate; in the tuner, two kernels
that cannot reuse each other both reuse a bridge."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import te

from support.kernel_cases import host_target, random_args, run_kernel
from packager.optimize.schedule.tuning.bridge import bridge_kernel, candidates, checked, choose
from packager.optimize.schedule.gensor.cpu_model import CpuSpace
from packager.optimize.schedule.measure.database import TuningDatabase
from packager.optimize.schedule.gensor.cpu import GensorCpu, schedule_kernels_gensor
from packager.optimize.schedule.tuning.reuse import reusable, reuse_tree, sketch_of
from packager.optimize.schedule.tuning.tune import TRIALS_PER_KERNEL, reuse_cap, tune_kernels
from packager.optimize.schedule.gensor.walk import construct
from packager.spec import OptimizeSpec
from test_reuse import conv, matmul


def packed_matmul(n: int, k: int, m: int, block: int = 16):
    """A matmul on a panel-packed weight (w[j // block, k, j % block]), as the layout pass packs."""
    a = te.placeholder((n, k), name="a")
    w = te.placeholder((m // block, k, block), name="w")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, r] * w[j // block, r, j % block], axis=r), name="mm")
    return te.create_prim_func([a, w, c])


def test_the_papers_bridge_joins_two_kernels_that_cannot_reuse_each_other():
    """ETO's example: [1,64,14,14,64,3,3] and [1,64,28,28,64,1,1] -> bridge [1,64,14,14,64,1,1];
    with it the tree has one root instead of two."""
    nodes = {"a": ("c2d", (1, 64, 14, 14, 64, 3, 3)), "b": ("c2d", (1, 64, 28, 28, 64, 1, 1)),
             "other": ("bmm", (1, 64, 14, 14, 64, 1, 1))}
    [br] = candidates(nodes)
    assert br.extents == (1, 64, 14, 14, 64, 1, 1) and br.sketch == "c2d"
    parents, chosen = choose(nodes, 24, 6)
    assert chosen == [br]
    assert sum(p is None for p in parents.values()) == 2               # one per sketch
    assert {parents["a"], parents["b"], parents[br.name]} - {None} <= {"a", "b", br.name}
    assert br.name in (parents["a"], parents["b"])                      # someone reuses the bridge


def test_no_bridge_where_kernels_reuse_each_other_or_it_does_not_pay():
    chain = {"a": ("s", (8, 8, 8)), "b": ("s", (16, 8, 8)), "c": ("s", (16, 16, 8))}
    assert candidates(chain) == []
    # a bridge that joins two kernels costs its own tuning: worth it only when reuse is cheap
    crossing = {"a": ("s", (8, 32)), "b": ("s", (32, 8))}
    assert choose(crossing, 24, 6)[1] != []
    assert choose(crossing, 24, 20)[1] == []


@pytest.mark.parametrize("seed", range(6))
def test_steiner_tree_is_never_costlier_than_the_arborescence(seed):
    """On random kernel sets, the greedy Steiner tree costs at most the arborescence without
    bridges, every chosen bridge is reused, and every reuse edge satisfies Definition 2."""
    rng = np.random.default_rng(seed)
    nodes = {f"k{i}": (f"s{rng.integers(2)}", tuple(int(x) for x in 2 ** rng.integers(0, 5, size=4)))
             for i in range(8)}
    nodes = {n: v for n, v in nodes.items() if v not in [nodes[m] for m in nodes if m < n]}
    without = reuse_tree(nodes, 24, 6)[1]
    parents, chosen = choose(nodes, 24, 6)
    extents = {**{n: v for n, v in nodes.items()}, **{b.name: (b.sketch, b.extents) for b in chosen}}
    with_cost = reuse_tree(extents, 24, 6)[1]
    assert with_cost <= without + 1e-9
    used = {p for p in parents.values() if p}
    assert all(b.name in used for b in chosen)
    for child, parent in parents.items():
        if parent:
            assert extents[child][0] == extents[parent][0] and reusable(extents[child][1], extents[parent][1])


@pytest.mark.parametrize("make, smaller", [
    (lambda: conv(16, 32, 14, 3), (1, 16, 6, 6, 8, 1, 1)),
    (lambda: conv(16, 32, 14, 3, stride=2), (1, 8, 4, 4, 16, 3, 3)),
    (lambda: packed_matmul(64, 96, 128), (32, 64, 96)),
], ids=["conv", "strided-conv", "packed-matmul"])
def test_bridge_kernel_has_the_sketch_and_computes_its_product(make, smaller):
    target = host_target()
    g = GensorCpu(target, TuningDatabase(None), measure=False, top_k=1)
    src = make()
    wl = g.workload(src)
    extents = tuple(min(e, s) for e, s in zip(wl.extents, smaller))
    bridge = bridge_kernel(src, g.rules, extents)
    assert checked(bridge, g, sketch_of(wl), extents)
    # a Gensor plan of the bridge lowers and computes what the unscheduled bridge computes
    space = CpuSpace(g.workload(bridge), g.hw)
    plan = space.to_plan(construct(space, 1, restarts=2)[0][1])
    args = random_args(bridge)
    np.testing.assert_allclose(run_kernel(g.lower(bridge, plan), target, args), run_kernel(bridge, target, args),
                               rtol=1e-4, atol=1e-4)


def test_bridge_kernel_of_a_packed_matmul_reads_a_packed_weight():
    """The bridge keeps the source's index expressions: a panel-packed weight stays packed, its
    shape as large as those indices reach, and the product equals numpy's."""
    target = host_target()
    g = GensorCpu(target, TuningDatabase(None), measure=False, top_k=1)
    bridge = bridge_kernel(packed_matmul(64, 96, 128), g.rules, (32, 64, 48))
    shapes = [[int(d) for d in p.shape] for p in bridge.params]
    assert shapes == [[32, 48], [4, 48, 16], [32, 64]]
    a, w, out = random_args(bridge)
    got = run_kernel(bridge, target, [a, w, out])
    want = a @ w.transpose(1, 0, 2).reshape(48, 64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_bridge_kernel_refuses_an_anchor_that_is_not_a_product():
    a = te.placeholder((32, 64), name="a")
    r = te.reduce_axis((0, 64), name="r")
    rowsum = te.create_prim_func([a, te.compute((32,), lambda i: te.sum(a[i, r] * 2.0, axis=r), name="s")])
    g = GensorCpu(host_target(), TuningDatabase(None), measure=False, top_k=1)
    assert bridge_kernel(rowsum, g.rules, (16, 32)) is None


def test_tuner_tunes_a_bridge_both_crossing_kernels_reuse(tmp_path):
    """Two matmuls whose extents cross (one has more rows, the other more columns) reuse neither
    way; at level 3 the tuner joins them through their bridge (tuned from one of them or from
    scratch, the other starts from its program within the reuse cap), the bridge is recorded (marked) in the database, and the tuned kernels compute the same."""
    target = host_target()
    kernels = {"tall": matmul(256, 128, 64), "wide": matmul(64, 128, 256)}
    opt = OptimizeSpec(level=3, database=tmp_path, top_k=2)
    _, report = tune_kernels(kernels, target, opt, log=lambda _m: None)
    d = report.details
    [(name, br)] = d["bridges"].items()
    assert br["extents"] == [64, 64, 128] and sorted(br["between"]) == ["tall", "wide"]
    assert br["reused_by"] == sorted(k for k, v in d["kernels"].items() if v["reused_from"] == name)
    assert set(br["reused_by"]) | {br["reused_from"]} == {"tall", "wide"}     # joined through the bridge
    for k in br["reused_by"]:
        assert 1 <= d["kernels"][k]["trials"] <= reuse_cap(TRIALS_PER_KERNEL)
    assert d["timed"] == br["trials"] + sum(k["trials"] for k in d["kernels"].values()) <= d["budget"]["trials"]
    assert "ETO bridges: 1 tuned" in report.summary
    db = TuningDatabase(tmp_path)
    marked = [r for r in db.records.values() if r.get("bridge")]
    assert len(marked) == 1 and marked[0]["kernel"] == name and marked[0]["tuned"] == br["trials"]
    out, _ = schedule_kernels_gensor(kernels, target, tmp_path, True, 2, reuse=True, tuned=True)
    for k, func in kernels.items():
        args = random_args(func)
        np.testing.assert_allclose(run_kernel(out[k], target, args), run_kernel(func, target, args),
                                   rtol=1e-4, atol=1e-4)
    # without bridges the two are roots: nothing marked, no bridge line
    _, plain = tune_kernels(kernels, target, OptimizeSpec(level=3, passes={"bridges": False},
                                                          database=tmp_path / "plain", top_k=2), log=lambda _m: None)
    assert plain.details["bridges"] == {} and "ETO bridges" not in plain.summary
    assert all(v["reused_from"] is None for v in plain.details["kernels"].values())
