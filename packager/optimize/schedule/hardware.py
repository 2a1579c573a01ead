"""The hardware model the scheduler's formulas read: memory levels with capacity, latency and
bandwidth (Gensor Eq. 1-2 and the capacity check), bank width (Eq. 3), compute peaks and
parallelism for the final ranking.

Numbers are datasheet/vendor figures, not measurements (the paper uses theoretical metrics
too). For the build host's own CPU the core count and cache sizes are read from sysfs.
Bandwidths are bytes per cycle per core (CPU) or per SM (GPU).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from ...targets import Target, can_run_here

if TYPE_CHECKING:
    from tvm import tirx

# A kernel reducing at most this many products per output (3x3 (9) ... 8x8 windows; a 3-channel
# 3x3 conv is 27) reads each input element a few times: memory-bound on every target.
MEMORY_BOUND_REDUCTION = 64


@dataclass(frozen=True)
class MemLevel:
    name: str
    capacity: int               # bytes usable per core (CPU) / per block or thread (GPU)
    latency: float              # cycles
    bandwidth: float            # bytes per cycle per core / per SM, into the level above


@dataclass(frozen=True)
class Hardware:
    """Memory levels outer (DRAM) to inner (registers), plus compute facts."""

    name: str
    levels: tuple[MemLevel, ...]
    cores: int                  # CPU cores / GPU SMs
    flops_per_cycle: float      # fp32 per core / per SM
    ghz: float
    lanes: int = 1              # CPU fp32 vector lanes
    vector_registers: int = 32  # CPU
    fma_latency: int = 4        # CPU: cycles; with 2 pipes, 8 independent chains hide it
    bank_width: int = 32        # GPU shared-memory banks (4-byte words)
    max_threads: int = 1024     # GPU threads per block
    smem_per_block: int = 48 * 1024   # GPU static shared memory a kernel may use
    registers_per_thread: int = 255
    warp: int = 32

    def level(self, name: str) -> MemLevel:
        return next(lv for lv in self.levels if lv.name == name)

    def bytes_per_second(self, name: str) -> float:
        """What all cores (SMs) together move out of level `name`."""
        return self.level(name).bandwidth * self.cores * self.ghz * 1e9


@lru_cache(maxsize=None)
def _sysfs_cache(level: int) -> int | None:
    """Per-core data/unified cache size of this machine at `level` (bytes), from sysfs."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")) if base.exists() else []:
        try:
            if int((idx / "level").read_text()) != level or (idx / "type").read_text().strip() == "Instruction":
                continue
            text = (idx / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1024, "M": 1 << 20}.get(text[-1], 1)
        return int(text.rstrip("KM")) * scale
    return None


# Per-core caches when the target is not this machine: AVX2 = Intel Skylake/Alder client-class
# and Zen 3 (32 KB L1d, 512 KB-1.25 MB L2); AVX-512 = Sapphire Rapids / Zen 4 (48/32 KB L1d,
# 1-2 MB L2); ARM64 = Neoverse N1/V1 and Orin's Cortex-A78AE (64 KB L1d, 256 KB-1 MB L2, we take
# 512 KB). Bandwidths: 2 x 32/64 B loads per cycle from L1, 32/64 B per cycle from L2, and what a
# copy streams per core out of the shared last-level cache (llc_bw; a layout conversion timed on a
# Zen 4 EPYC moved 16 B per cycle per core, 2 cores at 2.6 GHz).
CPU_NOMINAL = {
    "avx2": {"l1": 32 << 10, "l2": 512 << 10, "l1_bw": 64, "l2_bw": 32, "cores": 8, "ghz": 3.0, "vregs": 16,
             "llc": 16 << 20, "llc_bw": 16},
    "avx512": {"l1": 48 << 10, "l2": 1 << 20, "l1_bw": 128, "l2_bw": 64, "cores": 8, "ghz": 2.6, "vregs": 32,
               "llc": 32 << 20, "llc_bw": 16},
    "neon": {"l1": 64 << 10, "l2": 512 << 10, "l1_bw": 48, "l2_bw": 32, "cores": 8, "ghz": 2.2, "vregs": 32,
             "llc": 4 << 20, "llc_bw": 16},
}


def last_level_cache(t: Target) -> int:
    """Bytes of the largest cache level (shared L3, or L2 where there is none): this machine's
    when the target is timed here, else the nominal table's."""
    if can_run_here(t) and t.rpc is None:
        found = _sysfs_cache(3) or _sysfs_cache(2)
        if found:
            return found
    return CPU_NOMINAL[t.isa]["llc"]


def resident_in_llc(t: Target, nbytes: int) -> bool:
    """Whether `nbytes` just written stay in the last-level cache for the next kernel to read."""
    return nbytes <= last_level_cache(t)


def weight_heavy(func: "tirx.PrimFunc", hw: Hardware) -> bool:
    """Whether a kernel's weights (its arguments but the first, the activation, and the last, the
    output) reach half a core's L2 and at least twice the activation and output together. Between
    two runs of such a kernel a model streams everything else through the caches, so its weights
    come from memory, not L2: EfficientNet-B0's 1x1 convs at 7x7 (0.9-1.5 MB of weights, 0.3 MB
    of activations) ran 1.7-2x their warm build-time timing in the package, and as fast as timed
    when run twice in a row (docs/corpus.md); warm and flushed timings rank their plans differently."""
    if len(func.params) < 3:
        return False
    size = [_buffer_bytes(p) for p in func.params]
    if None in size:                             # a dynamic shape: its sizes are not known here
        return False
    weights, moved = sum(size[1:-1]), size[0] + size[-1]
    return weights >= hw.level("L2").capacity // 2 and weights >= 2 * moved


def _buffer_bytes(param) -> int | None:
    n = param.dtype.bits // 8 * param.dtype.lanes
    for d in param.shape:
        if not hasattr(d, "value"):
            return None
        n *= int(d.value)
    return n


def llc_bytes_per_second(hw: Hardware, t: Target) -> float:
    """What all cores together stream out of the last-level cache (bytes / s)."""
    return CPU_NOMINAL[t.isa]["llc_bw"] * hw.cores * hw.ghz * 1e9


def cpu_hardware(t: Target) -> Hardware:
    """CPU levels DRAM -> L2 -> L1 -> registers. Cores and caches come from this machine when the
    target runs here and is timed here, else from the nominal table above."""
    row = CPU_NOMINAL[t.isa]
    l1, l2, cores, ghz = row["l1"], row["l2"], row["cores"], row["ghz"]
    if can_run_here(t) and t.rpc is None:
        from ...targets import host_ghz
        l1, l2 = _sysfs_cache(1) or l1, _sysfs_cache(2) or l2
        cores, ghz = os.cpu_count() or cores, host_ghz()
    dram_bw = t.dram_gbs_per_core / ghz
    lanes = t.vector_lanes_f32
    return Hardware(
        f"{t.name} ({t.isa})",
        (MemLevel("DRAM", 1 << 40, 200.0, dram_bw),
         MemLevel("L2", l2, 14.0, row["l2_bw"]),
         MemLevel("L1", l1, 5.0, row["l1_bw"]),
         MemLevel("reg", row["vregs"] * lanes * 4, 1.0, 2 * lanes * 4)),
        cores=cores, flops_per_cycle=t.flops_per_cycle, ghz=ghz, lanes=lanes, vector_registers=row["vregs"])


def gpu_hardware(t: Target) -> Hardware:
    """GPU levels DRAM -> shared memory -> registers (L = 2, as in the paper). Latencies are the
    usual microbenchmark figures (DRAM ~500, shared ~25 cycles); shared memory moves 32 banks x
    4 B per cycle per SM; DRAM bandwidth per SM is the datasheet figure spread over the SMs."""
    f = t.facts or {"sms": 80, "dram_gbs": 900, "fp32_tflops": 15.7, "boost_clock_mhz": 1500}
    ghz = f.get("boost_clock_mhz", 1500) / 1000
    sms = t.sm_count
    dram_bw = f.get("dram_gbs", 900) / ghz / sms
    flops = f.get("fp32_tflops", 15.7) * 1e12 / (ghz * 1e9) / sms
    return Hardware(
        f"{t.name} ({t.sm})",
        (MemLevel("DRAM", 1 << 40, 500.0, dram_bw),
         MemLevel("shared", 48 * 1024, 25.0, 128.0),
         MemLevel("reg", 255 * 4, 1.0, 512.0)),
        cores=sms, flops_per_cycle=flops, ghz=ghz)
