"""Where a padding stage is computed (padding.py, TilePlan.pad): staged for the whole kernel, per
parallel task or inlined into the reads, offered to memory-bound kernels only (inline only where
the lanes share a bounds test), lowered correctly, chosen by timing."""
from __future__ import annotations

import tempfile
from dataclasses import replace

import numpy as np
import pytest
import tvm_ffi
from tvm import s_tir, te, tirx, topi

from support.kernel_cases import host_target, random_args, run_kernel
from packager.optimize.layout.conv import ConvLayouts, conv2d_packed
from packager.optimize.layout.sites import ConvSite
from packager.optimize.schedule.gensor.cpu_lower import lower_cpu
from packager.optimize.schedule.gensor.cpu_model import CpuSpace
from packager.optimize.schedule.measure.database import TuningDatabase
from packager.optimize.schedule.gensor.cpu import PAD_VARIANTS, GensorCpu
from packager.optimize.schedule.rules.padding import offers_inline, offers_per_task
from packager.optimize.schedule.gensor.plan import PADS, TilePlan
from packager.optimize.schedule.tuning.tune import mutate
from packager.optimize.schedule.gensor.walk import construct
from packager.optimize.schedule.gensor.window import window_plans


def _depthwise(c: int = 32, h: int = 20, stride: int = 2):
    """A 3x3 depthwise conv over NCHW16c, as the layout pass writes MobileNet's."""
    return ConvSite((1, c, h, h), (c, 1, 3, 3), (stride, stride), (1, 1, 1, 1), (1, 1), c, "float32").kernel(16, 16)


def _max_pool(c: int = 32, h: int = 20):
    x = te.placeholder((1, c // 16, h, h, 16), "float32", "x")
    return te.create_prim_func([x, topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max", layout="NCHW16c")])


def _depthwise_nchw(c: int = 32, h: int = 20, stride: int = 1):
    """The same conv over plain NCHW: the vector lanes run along the padded rows."""
    return ConvSite((1, c, h, h), (c, 1, 3, 3), (stride, stride), (1, 1, 1, 1), (1, 1), c, "float32").kernel(1, 1)


def _depthwise_gathering(c: int = 32, h: int = 20):
    """The NCHW16c conv with its input's layout transform folded in: the padding stage gathers
    each channel block's lanes from NCHW planes."""
    x = te.placeholder((1, c, h, h), "float32", "x")
    packed = te.compute((1, c // 16, h, h, 16), lambda n, o, y, z, i: x[n, o * 16 + i, y, z], "to_16c")
    wt = te.placeholder((c // 16, 1, 3, 3, 1, 16), "float32", "w")
    y = conv2d_packed(packed, wt, ConvLayouts(16, 1, 16, 16), c, c, (1, 1), (1, 1, 1, 1), (1, 1), c, "float32")
    return te.create_prim_func([x, wt, y])


def _conv3x3():
    return ConvSite((1, 32, 12, 12), (32, 32, 3, 3), (1, 1), (1,) * 4, (1, 1), 1, "float32").kernel(16, 16)


def _conv1x1():
    return ConvSite((1, 32, 12, 12), (32, 32, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, "float32").kernel(16, 16)


def _gensor(measure: bool = False) -> GensorCpu:
    return GensorCpu(host_target(), TuningDatabase(tempfile.mkdtemp()), measure, top_k=2)


def _block_names(func: tirx.PrimFunc) -> list[str]:
    names = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, lambda b: names.append(b.name_hint)), order="post")
    return names


def _padding_block(func: tirx.PrimFunc) -> tuple[bool, list[bool]]:
    """(whether the padding block has a loop nest of its own, no other block under its outermost
    loop; which of the loops around it are parallel, outermost first)."""
    sch = s_tir.Schedule(func)
    names = _block_names(func)
    pad = [n for n in names if n.startswith("pad")]
    assert len(pad) == 1, names
    loops = sch.get_loops(sch.get_sblock(pad[0]))
    outer = sch.get(loops[0])
    shared = [n for n in names if n != pad[0] and n != "root" and sch.get_loops(sch.get_sblock(n))
              and sch.get(sch.get_loops(sch.get_sblock(n))[0]).same_as(outer)]
    return not shared, [sch.get(lp).kind == tirx.ForKind.PARALLEL for lp in loops]


@pytest.mark.parametrize("make, offered", [(_depthwise, PADS), (_max_pool, PADS), (_depthwise_nchw, PADS[:2]),
                                           (lambda: _depthwise_nchw(stride=2), PADS[:2]),
                                           (_depthwise_gathering, PADS[:2]), (_conv3x3, PADS[:1]),
                                           (_conv1x1, PADS[:1])])
def test_only_memory_bound_kernels_with_a_padding_stage_are_offered_the_choice(make, offered):
    """Depthwise convs and pooling reduce over a window only; a conv that also reduces over its
    input channels is compute-bound, and a 1x1 conv has no padding stage at all. Inline padding
    needs lanes that share one bounds test: channels (NCHW16c), not positions along a padded row
    (NCHW; at stride 2 the row is read through a de-interleaved copy of the padded input), and a
    padding stage that copies its lanes rather than gathering them (a folded layout transform)."""
    func = make()
    sch = s_tir.Schedule(func)
    anchor = _gensor().rules.prepare_anchor(sch)
    assert offers_per_task(anchor) is (len(offered) > 1)
    assert offers_inline(sch, anchor) is (PADS[2] in offered)
    assert _gensor().workload(func).pads == offered


@pytest.mark.parametrize("make", [lambda: _depthwise(64, 56), lambda: _max_pool(64, 56)])
def test_padding_per_task_runs_inside_the_parallel_loop_and_computes_the_same(make):
    """A staged padding block is its own parallel loop nest before the kernel's; per task it sits
    inside the kernel's parallel loop (each task pads the rows it reads); inline there is no
    padding block. All three compute what the unscheduled kernel computes, for every plan tried."""
    func = make()
    target = host_target()
    g = _gensor()
    space = CpuSpace(g.workload(func), g.hw)
    args = random_args(func)
    want = run_kernel(func, target, [a.copy() for a in args])
    for _, state in construct(space, 5, restarts=2)[:3]:
        for pad in PADS:
            plan = replace(space.to_plan(state), pad=pad)
            sch = s_tir.Schedule(func)
            assert lower_cpu(sch, g.rules, g.rules.prepare_anchor(sch), plan) > 1
            lowered = sch.mod["main"]
            if pad == PADS[2]:
                assert not [n for n in _block_names(lowered) if n.startswith("pad")]
            else:
                own_nest, parallel = _padding_block(lowered)
            if pad == PADS[0]:
                assert own_nest and parallel[0], parallel
            elif pad == PADS[1]:
                assert not own_nest and parallel[0] and not any(parallel[1:]), parallel   # the kernel's task loop
            got = run_kernel(lowered, target, [a.copy() for a in args])
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make, pad, why", [(_conv3x3, PADS[1], "no padding stage"),
                                           (_conv3x3, PADS[2], "no padding stage"),
                                           (_depthwise_nchw, PADS[2], "vector lanes")])
def test_a_kernel_refuses_a_placement_it_does_not_offer(make, pad, why):
    """A conv over input channels offers neither; an NCHW depthwise conv (lanes along the
    padded row) offers per task, not inline."""
    func = make()
    g = _gensor()
    space = CpuSpace(g.workload(func), g.hw)
    plan = replace(space.to_plan(construct(space, 1, restarts=1)[0][1]), pad=pad)
    sch = s_tir.Schedule(func)
    with pytest.raises(ValueError, match=why):
        lower_cpu(sch, g.rules, g.rules.prepare_anchor(sch), plan)


def test_the_plan_records_where_the_padding_goes():
    """Recorded with the plan; a record written before the choice existed reads as staged."""
    func = _depthwise()
    g = _gensor()
    space = CpuSpace(g.workload(func), g.hw)
    plan = replace(space.to_plan(construct(space, 1, restarts=1)[0][1]), pad=PADS[1])
    assert TilePlan.from_dict(plan.as_dict()) == plan
    old = {k: v for k, v in plan.as_dict().items() if k != "pad"}
    assert TilePlan.from_dict(old).pad == PADS[0]
    assert "(pad per-task)" in plan.describe()
    assert "(pad inline)" in replace(plan, pad=PADS[2]).describe()


def test_the_switch_off_leaves_staged_and_per_task_padding():
    """optimize.passes.pad_inline: false -> GensorCpu(inline_pads=False): no kernel is offered
    inline, and a measured schedule times its variants per task."""
    g = GensorCpu(host_target(), TuningDatabase(tempfile.mkdtemp()), True, top_k=2, inline_pads=False)
    func = _depthwise(64, 28)
    assert g.workload(func).pads == PADS[:2]
    _, _, choice = g.schedule(func, "dw")
    assert choice.plan.pad in PADS[:2]


def test_the_tuner_moves_the_padding_only_where_the_kernel_offers_it():
    rng = np.random.default_rng(0)
    for func, offered in ((_depthwise(), PADS), (_depthwise_nchw(), PADS[:2]), (_conv3x3(), PADS[:1])):
        g = _gensor()
        space = CpuSpace(g.workload(func), g.hw)
        plan = space.to_plan(construct(space, 1, restarts=1)[0][1])
        pads = {mutate(space, plan, rng).pad for _ in range(300)}
        assert pads == set(offered)


def test_gensor_times_the_best_plans_again_with_their_padding_elsewhere():
    """The cost model does not tell the placements apart, so the best-estimated plans are timed
    staged and with the kernel's preferred other placement (inline over NCHW16c): a depthwise
    conv times top-k + PAD_VARIANTS plans (+ its window plans, inline too, and the rules), a 3x3
    conv over input channels top-k, and what wins is recorded."""
    dw = _gensor(measure=True)
    func = _depthwise(64, 28)
    windows = len(window_plans(CpuSpace(dw.workload(func), dw.hw)))
    _, _, choice = dw.schedule(func, "dw")
    assert choice.trials == dw.top_k + PAD_VARIANTS + windows + 1          # + its register-blocked rows
    assert choice.plan.pad in PADS
    conv = _gensor(measure=True)
    _, _, choice = conv.schedule(_conv3x3(), "conv")
    assert choice.trials == conv.top_k + 1 and choice.plan.pad == PADS[0]
