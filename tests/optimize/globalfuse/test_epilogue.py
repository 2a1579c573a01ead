"""Reduction epilogues: a memory-intensive conv joins the compute-intensive conv it sums."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import tvm
from tvm import relax

from packager.optimize.globalfuse.epilogue import reduction_epilogues
from packager.optimize.globalfuse.graph import kernel_graph
from support.kernel_cases import conv_then_channel_sum, host_target, optimized_module, scheduler


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _kernels(mod: tvm.IRModule) -> list[str]:
    """The names of main's kernels other than layout transforms."""
    return [c.name for c in kernel_graph(mod).calls.values() if "layout_transform" not in c.name]


def _epilogues(summed_to: int):
    target = host_target()
    mod = optimized_module(conv_then_channel_sum(16, 32, 12, summed_to), target, global_fusion=False)
    sched = scheduler(target)
    out, merged = reduction_epilogues(mod, SimpleNamespace(target=target, scheduler=sched), sched, None)
    return mod, out, merged


def test_a_channel_sum_joins_its_conv_and_the_module_computes_the_same():
    mod, out, merged = _epilogues(summed_to=1)
    assert merged.taken == 1 and "reduction epilogues" in merged.line() and "not measured" in merged.line()
    # On some hosts (AVX-512 here) the conv packs its input in a kernel of its own: count the rest.
    before, after = (_kernels(m) for m in (mod, out))
    assert len(before) == 2 and len(after) == 1 and after[0].startswith("gf_epi")
    x = np.random.default_rng(3).standard_normal((1, 16, 12, 12)).astype(np.float32)
    np.testing.assert_allclose(_run(out, x), _run(mod, x), rtol=1e-4, atol=1e-4)


def test_a_compute_intensive_reader_stays_a_kernel_of_its_own():
    """A 1x1 conv to 64 channels does 8 FLOPs per byte: it is no epilogue."""
    mod, out, merged = _epilogues(summed_to=64)
    assert merged.taken == 0 and len(kernel_graph(out).calls) == len(kernel_graph(mod).calls)


def test_fusions_are_timed_warm_for_a_model_timed_cold(monkeypatch, tmp_path):
    """A model whose weights exceed the cache has its kernel candidates timed cold, but a merged
    kernel and its parts are timed warm: what a fusion changes is an intermediate's trip, and in
    the package that activation is in cache."""
    from dataclasses import replace

    from packager.optimize.globalfuse import timing
    from packager.optimize.schedule import cpu

    seen = []
    monkeypatch.setattr(cpu, "time_interleaved", lambda funcs, target, tally=None, **_: seen.append(target) or
                        [1e-3] * len(funcs))
    cold = replace(host_target(), cold_weights=True)
    mod = optimized_module(conv_then_channel_sum(16, 32, 12), host_target(), global_fusion=False)
    parts = [c.prim for c in kernel_graph(mod).calls.values()]
    timing.FusionTimer(scheduler(cold, tmp_path, level=2)).compare(parts[0], [(parts[1], 1.0)])
    assert seen and not any(t.cold_weights for t in seen)
