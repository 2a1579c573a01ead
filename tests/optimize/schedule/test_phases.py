"""Phased GPU kernels (schedule/phases.py): a chain global fusion merged is cut into its phases,
each scheduled as the kernel it was, and stitched back; the stitched kernel computes the same and
lowers to one device kernel per phase, the tensor between phases in global scratch memory."""
from __future__ import annotations

import numpy as np
import pytest

from packager.codegen.cuda_source import generate_cuda
from packager.optimize.schedule.phases import (PHASE_ATTR, PhaseError, phase_sizes, split_phases, stitch,
                                               thread_shape)
from packager.optimize.schedule.rules.gpu import schedule_kernels_gpu
from packager.spec import TargetSpec
from packager.targets import resolve
from support.kernel_cases import host_target, phased_matmuls, random_args, run_kernel


@pytest.fixture(scope="module")
def h100():
    return resolve(TargetSpec("h100", {}, "test"))


def test_split_then_stitch_computes_the_same():
    f = phased_matmuls()
    phases, passed = split_phases(f, phase_sizes(f))
    assert [p.name for p in passed] == ["c"]                       # the product goes from phase 1 to 2
    assert all(PHASE_ATTR not in p.attrs for p in phases)          # each phase is a plain kernel
    assert [p.name for p in phases[0].params] == ["a", "b", "c"]    # ... that writes the product
    assert [p.name for p in phases[1].params] == ["d", "e", "c"]    # ... and reads it
    stitched = stitch(f, phases, passed)
    assert phase_sizes(stitched) == [1, 1]
    target = host_target()
    args = random_args(f)
    a, b, d = args[:3]
    want = (a @ b) @ d
    np.testing.assert_allclose(run_kernel(f.without_attr(PHASE_ATTR), target, [x.copy() for x in args]), want,
                               rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(run_kernel(stitched.without_attr(PHASE_ATTR), target, [x.copy() for x in args]),
                               want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("sizes", [[1], [2, 0], [1, 1, 1], [3]])
def test_split_refuses_phases_that_do_not_cover_the_blocks(sizes):
    with pytest.raises(PhaseError):
        split_phases(phased_matmuls(), sizes)


def test_phases_scheduled_for_a_gpu_lower_to_one_launch_each(h100):
    scheduled, report = schedule_kernels_gpu({"chain": phased_matmuls()}, h100)
    assert report.details["kernels"]["chain"].startswith("phases(")
    assert "1 phases" in report.summary
    launches = generate_cuda(scheduled, h100).kernels["chain"]
    assert len(launches.launches) == 2
    assert launches.workspace == [128 * 64 * 4]                    # the product, in global scratch
    assert all(-1 in ln.args for ln in launches.launches)          # written by one, read by the other


def test_thread_shape_is_the_launch_block(h100):
    f = phased_matmuls()
    phase = split_phases(f, phase_sizes(f))[0][0]
    scheduled, _ = schedule_kernels_gpu({"k": phase}, h100)
    launch = generate_cuda(scheduled, h100).kernels["k"].launches[0]
    assert thread_shape(scheduled["k"]) == tuple(launch.block)


def test_gensor_holds_a_phase_to_the_block_it_is_given(h100, tmp_path):
    """A phase whose best plan has another block than its chain's takes the best plan with the
    chain's block (an estimate no better than the free one), recorded apart from the free one."""
    from packager.optimize.schedule.measure.database import TuningDatabase
    from packager.optimize.schedule.gensor.gpu import GensorGpu
    from packager.optimize.schedule.phases import gensor_phase

    f = phased_matmuls()
    phase = split_phases(f, phase_sizes(f))[0][0]
    construct = GensorGpu(h100, TuningDatabase(tmp_path))
    free = construct.schedule(phase)
    want = 64 if thread_shape(free[0])[0] != 64 else 128
    held = gensor_phase(construct, phase, want)
    assert thread_shape(held[0]) == (want, 1, 1) and held[1].plan.gpu_threads() == want
    assert held[1].estimate_ms >= free[1].estimate_ms
    assert gensor_phase(construct, phase, None)[1].plan == free[1].plan     # the free plan is kept
    assert len(construct.db.new) == 2
