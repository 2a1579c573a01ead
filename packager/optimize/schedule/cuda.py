"""The CUDA scheduler: tensor cores for fp16 matmuls, Gensor's GPU construction (analytical: no
GPU at build time), then dlight's rules; a kernel that must keep a block shape (a phase of a
grid-synchronised kernel) gets the best plan with that many threads."""
from __future__ import annotations

from functools import cached_property

import tvm
from tvm import tirx

from ...errors import UserError
from ...targets.table import STATIC_SHARED_BYTES
from ..base import PassReport
from .contract import ONLY_GENSOR_REUSES, KernelScheduler, Trial
from .gensor.gpu import GensorGpu, gpu_target_key
from .hardware import Hardware, gpu_hardware
from .phases import gensor_phase
from .rules import recurrence
from .rules.gpu import dlight_rules, schedule_kernels_gpu, schedule_one
from .rules.tensor_core import tensor_core_matmul

Kernels = dict[str, tirx.PrimFunc]
CPU_ONLY = "CPU targets only in this version"


class CudaScheduler(KernelScheduler):
    kind = "cuda"
    LACKS = {
        "row_regions": f"{CPU_ONLY}: a GPU row region needs a block-level rule of its own",
        "reduction_epilogues": CPU_ONLY,
        "int8": f"{CPU_ONLY}: QDQ matmuls and convs in float32 (dp4a / integer tensor cores not built)",
        "window_rows": f"{CPU_ONLY}: a GPU thread's register tile is Gensor's thread level",
        "pad_inline": f"{CPU_ONLY}: a GPU kernel stages its padded tile in shared memory",
        "cold_heavy": f"{CPU_ONLY}: GPU kernels are not timed at build time",
    }

    def __init__(self, target, opt=None, tally=None):
        super().__init__(target, opt, tally)
        self.tvm_target = tvm.target.Target(target.tvm_target())
        self.memo: dict[tuple, Trial] = {}     # by (TIR text, held threads), as the database keys

    @property
    def can_measure(self) -> bool:
        return False

    @cached_property
    def gensor(self) -> GensorGpu | None:
        return GensorGpu(self.target, self.database()) if self.opt.scheduler == "gensor" else None

    def hardware(self) -> Hardware:
        return gpu_hardware(self.target)

    def target_key(self) -> str:
        return gpu_target_key(self.target)

    def scheduled(self, func: tirx.PrimFunc, threads: int | None = None) -> Trial:
        """Gensor's plan first, as in the schedule pass, then dlight's rules. Kept by the kernel's
        text, names included, as the tuning database keys Gensor's records."""
        key = (func.script(), threads)
        if key not in self.memo:
            self.memo[key] = self._schedule(func, threads)
        return self.memo[key]

    def _schedule(self, func: tirx.PrimFunc, threads: int | None) -> Trial:
        looped = recurrence.gpu(func)
        if looped is not None:
            return Trial(looped, "recurrence")
        with self.tvm_target:
            mma = (tensor_core_matmul(func, self.tvm_target, STATIC_SHARED_BYTES, self.target.max_shared_bytes,
                                      self.target.sm_count) if threads is None else None)
            if mma is not None:
                return Trial(mma[0], "tensor-core")
            made = gensor_phase(self.gensor, func, threads) if self.gensor is not None else None
            if made is not None:
                return Trial(made[0], "gensor", made[1].estimate_ms)
            try:
                return Trial(*schedule_one("trial", func.with_attr("target", self.tvm_target), self.tvm_target,
                                           dlight_rules()))
            except UserError:
                return Trial(None, "none")

    def schedule_pass(self, kernels: Kernels) -> tuple[Kernels, PassReport]:
        opt = self.opt
        return schedule_kernels_gpu(kernels, self.target, full=opt.enabled("schedule"),
                                    gensor=opt.scheduler == "gensor", database=opt.database)

    def why_not_tuned(self) -> str | None:
        return "GPU kernels are not timed at build time (no GPU on the build host); Gensor's analytical choice stands"

    def reuse_note(self) -> str | None:
        return ONLY_GENSOR_REUSES
