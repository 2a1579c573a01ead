"""Grid phases (phases.py): a GPU target's chains of kernels become one phased kernel that keeps
its block shapes; a CPU target takes none."""
from __future__ import annotations

from packager.optimize.globalfuse.graph import kernel_graph
from packager.optimize.globalfuse.phases import MAX_PHASES
from packager.optimize.schedule.phases import phase_sizes, phase_threads, split_phases, thread_shape
from packager.optimize.schedule.registry import scheduler_for
from support.globalfuse_cases import optimized, report_of


def test_gpu_chains_become_phased_kernels(transformer, h100):
    """Chains of kernels (each read only by the next) merge into phased kernels, and only where
    every phase keeps one block shape (no thread of the cooperative kernel idles)."""
    fused, reports = optimized(transformer, h100)
    gf = report_of(reports, "global_fusion")
    chains = gf.details["grid_phases"]["chains"]
    assert chains and all(2 <= len(c) <= MAX_PHASES for c in chains), gf.summary
    assert f"{len(chains)} chain(s)" in gf.summary
    called = {c.func.name_hint: c.prim for c in kernel_graph(fused).calls.values()}
    phased = [f for f in called.values() if phase_sizes(f)]
    assert len(phased) == len({tuple(c) for c in chains}), gf.summary   # identical chains share a kernel
    rules = scheduler_for(h100)
    for f in phased:
        phases, _ = split_phases(f, phase_sizes(f))
        assert len({thread_shape(rules.scheduled(p, phase_threads(f)).func) for p in phases}) == 1
    assert gf.details["kernels_after"] < gf.details["kernels_before"]


def test_cpu_targets_take_no_grid_phases(transformer):
    _, reports = optimized(transformer)
    assert "GPU targets only" in report_of(reports, "global_fusion").details["grid_phases"]["skipped"]
