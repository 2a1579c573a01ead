"""Cooperative kernels (codegen/cuda_grid.py): a phased kernel's device kernels join into one
kernel with a grid barrier between phases, compiled for every CUDA architecture of the table,
with a grid every block of which can be resident at once (sized from cuobjdump's registers and
shared memory and the target's hardware row)."""
from __future__ import annotations

import re

import pytest

from packager.codegen import cuda_grid
from packager.codegen.cuda_grid import GridReport, Joined, blocks_per_sm, cooperative_launches, join_phases
from packager.codegen.cuda_source import generate_cuda
from packager.codegen.cuda_toolchain import compile_fatbin
from packager.optimize.schedule.rules.gpu import schedule_kernels_gpu
from packager.spec import TargetSpec
from packager.targets import resolve
from support.kernel_cases import phased_matmuls


def _target(name: str):
    return resolve(TargetSpec(name, {}, "test"))


def _module(t):
    scheduled, _ = schedule_kernels_gpu({"chain": phased_matmuls()}, t)
    return generate_cuda(scheduled, t)


@pytest.mark.parametrize("name", ["v100", "a100", "orin", "h100"])
def test_a_phased_kernel_joins_into_one_cooperative_kernel(name, tmp_path):
    t = _target(name)
    cm = _module(t)
    phases = cm.kernels["chain"].launches
    source, joined, refused = join_phases(cm, {"chain"})
    assert not refused and len(phases) == 2
    wrapper = joined["chain"]
    assert source.count("pk_grid.sync()") == 1                     # one barrier between two phases
    assert all(f"{ln.function}(" not in source for ln in phases)   # phases are device functions now
    signature = source[source.index(f"{wrapper.function}("):].split(")")[0]
    assert "__restrict__" not in signature                         # the product is written, then read
    fatbin = tmp_path / "k.fatbin"
    compile_fatbin(source, t.sm, fatbin)
    report = GridReport()
    launch = cooperative_launches(joined, fatbin, t.facts, t.sm_number, report)["chain"]
    info = report.joined["chain"]
    assert launch.cooperative and launch.block == phases[0].block
    assert info["co_resident"] == info["blocks_per_sm"] * t.facts["sms"] > 0
    assert launch.grid == [min(max(info["phase_blocks"]), info["co_resident"]), 1, 1]
    assert sorted(set(launch.args)) == sorted({a for ln in phases for a in ln.args})


def test_phases_of_different_block_shapes_stay_launches():
    t = _target("h100")
    cm = _module(t)
    cm.kernels["chain"].launches[1].block = [32, 1, 1]
    source, joined, refused = join_phases(cm, {"chain"})
    assert not joined and "different block shapes" in refused["chain"]
    assert source == cm.source


def test_phases_whose_kernels_have_one_thread_per_block_join():
    """TVM writes no __launch_bounds__ for a kernel of one thread per block (silero-vad's conv1d
    phases for h100 failed with 'no definition of ... in the CUDA source')."""
    t = _target("h100")
    cm = _module(t)
    cm.source = re.sub(r"__launch_bounds__\(\d+\) ", "", cm.source)
    source, joined, refused = join_phases(cm, {"chain"})
    assert list(joined) == ["chain"] and not refused


# Resident blocks per SM as NVIDIA's occupancy calculator gives them (threads, registers per
# thread, shared bytes -> blocks): thread-, register-, shared-memory- and block-count-limited.
@pytest.mark.parametrize("name, threads, regs, shared, blocks", [
    ("a100", 256, 32, 0, 8),          # 2048 threads / 256
    ("a100", 128, 64, 0, 8),          # 64 K registers / (64 x 128)
    ("a100", 32, 16, 48 * 1024, 3),   # 164 KB / (48 KB + 1 KB reserved)
    ("a100", 32, 16, 0, 32),          # at most 32 blocks
    ("orin", 32, 16, 0, 16),          # at most 16 blocks on 8.7
    ("v100", 1024, 65, 0, 0),         # 65 registers x 1024 threads do not fit: no block at all
])
def test_blocks_per_sm_follows_the_occupancy_rules(name, threads, regs, shared, blocks):
    t = _target(name)
    assert blocks_per_sm(t.facts, t.sm_number, threads, regs, shared) == blocks


def test_a_kernel_that_cannot_be_resident_is_refused(monkeypatch, tmp_path):
    t = _target("h100")
    monkeypatch.setattr(cuda_grid, "resource_usage", lambda fatbin: {"k_grid": (255, 0)})
    report = GridReport()
    joined = {"k": Joined("k_grid", [0, 1], [1024, 1, 1], 0, [8, 8])}
    assert cooperative_launches(joined, tmp_path / "unused.fatbin", t.facts, t.sm_number, report) == {}
    assert "not co-resident" in report.refused["k"]


def test_phases_whose_shared_memory_together_is_too_much_stay_launches():
    """Each phase may use up to 48 KB of static shared memory; joined, their arrays add up."""
    t = _target("h100")
    cm = _module(t)
    source, _, _ = join_phases(cm, {"chain"})
    for ln in cm.kernels["chain"].launches:                       # 32 KB more in each phase
        head = f"{ln.function}("
        at = cm.source.index("{", cm.source.index(head, cm.source.index(head) + 1)) + 1
        cm.source = cm.source[:at] + "\n  __shared__ alignas(64) float pad[8192];" + cm.source[at:]
    source, joined, refused = join_phases(cm, {"chain"})
    assert not joined and "48 KB" in refused["chain"] and source == cm.source
