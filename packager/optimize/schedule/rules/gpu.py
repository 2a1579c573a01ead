"""GPU schedules: every kernel gets thread bindings before CUDA code generation.

A PrimFunc without blockIdx/threadIdx bindings cannot run on a GPU at all (TVM's VerifyMemory
rejects it), so unlike the CPU this pass is not optional. The rules are TVM's dlight GPU rules,
tried per kernel in order: Matmul (shared-memory tiles), GEMV, Reduction, GeneralReduction
(softmax/layer norm rows), Transpose, and Fallback (flattened injective loops bound to
blocks x threads). A rule whose kernel has an index that can leave its buffer, or would declare
more than 48 KB of static shared memory, is passed over (tir_util.gpu_kernel_fault). Kernels
with one reduction anchor (conv, matmul, pooling) first go through
the construction-based scheduler (gensor/gpu.py, GensorGpu); the rules take what it cannot
place. A kernel global fusion merged from a chain (phases.py) is scheduled phase by phase. An fp16
matmul (a reduced-precision build) goes to the tensor cores first (tensor_core.py). The build
report names the plan or rule each kernel got.
"""
from __future__ import annotations

from collections import Counter

import tvm
from tvm import s_tir
from tvm.s_tir import dlight as dl

from ....errors import UserError
from .... import progress
from ....targets import Target
from ....targets.table import STATIC_SHARED_BYTES
from ...base import PassReport
from ..measure.database import TuningDatabase
from ..gensor.gpu import GensorGpu
from ..phases import gensor_phase, phase_sizes, phase_threads, schedule_phases
from ..tir_util import gpu_kernel_fault, unbound_blocks
from . import recurrence
from .tensor_core import tensor_core_matmul


def dlight_rules() -> list[tuple[str, object]]:
    return [("matmul", dl.gpu.Matmul()), ("gemv", dl.gpu.GEMV()), ("reduction", dl.gpu.Reduction()),
            ("general-reduction", dl.gpu.GeneralReduction()), ("transpose", dl.gpu.Transpose()),
            ("fallback", dl.gpu.Fallback())]


def schedule_one(name: str, func: tvm.tirx.PrimFunc, target: tvm.target.Target,
                  rules: list[tuple[str, object]]) -> tuple[tvm.tirx.PrimFunc, str]:
    errors = []
    for rule_name, rule in rules:
        try:
            space = rule.apply(func, target, False)
        except Exception as e:  # noqa: BLE001 - a rule that does not fit raises all kinds of errors
            errors.append(f"{rule_name}: {str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}")
            continue
        if space is None:
            continue
        sch = space[0] if isinstance(space, list) else space
        if isinstance(sch, s_tir.Schedule):
            out = sch.mod["main"]
            left = unbound_blocks(out)
            if left:
                errors.append(f"{rule_name}: leaves block(s) {', '.join(left)} unbound")
                continue
            fault = gpu_kernel_fault(out, STATIC_SHARED_BYTES)
            if fault:
                errors.append(f"{rule_name}: {fault}")
                continue
            return out.with_attr("tirx.is_scheduled", True), rule_name
    why = "; ".join(errors) or "no rule matched"
    raise UserError(f"kernel '{name}': no GPU schedule fits it ({why}); build this model for a CPU target, "
                    "or keep the operator in ONNX Runtime (onnxruntime.partial)")


def schedule_kernels_gpu(kernels: dict[str, tvm.tirx.PrimFunc], target: Target,
                         full: bool = True, gensor: bool = True, database=None) -> tuple[dict, PassReport]:
    """Thread-bound PrimFuncs for one CUDA target, and the per-kernel rule for the report. With
    the schedule pass off in the spec only the fallback binding runs (a GPU kernel needs one)."""
    tvm_target = tvm.target.Target(target.tvm_target())
    rules = dlight_rules() if full else dlight_rules()[-1:]
    out, chosen, plans = {}, {}, {}
    construct = GensorGpu(target, TuningDatabase(database)) if full and gensor else None
    def one(name: str, f: tvm.tirx.PrimFunc, threads: int | None = None) -> tuple[tvm.tirx.PrimFunc, str, str]:
        mma = (tensor_core_matmul(f, tvm_target, STATIC_SHARED_BYTES, target.max_shared_bytes, target.sm_count)
               if full and threads is None else None)
        if mma is not None:
            return mma[0], "tensor-core", f"tensor-core {mma[1]}"
        made = gensor_phase(construct, f, threads) if construct else None
        if made is not None:
            return made[0], "gensor", made[1].summary()
        func, rule = schedule_one(name, f.with_attr("target", tvm_target), tvm_target, rules)
        return func, rule, rule

    with tvm_target, progress.task(f"schedule {target.name}", len(kernels), "kernels") as bar:
        for name, f in kernels.items():
            bar.advance()
            looped = recurrence.gpu(f)
            if looped is not None:
                out[name], chosen[name], plans[name] = looped, "recurrence", "recurrence"
                continue
            if phase_sizes(f) is None:
                out[name], chosen[name], plans[name] = one(name, f)
                continue
            threads = phase_threads(f)
            out[name], plans[name] = schedule_phases(f, lambda p: one(name, p, threads)[::2])
            chosen[name] = "phases"
    if construct:
        construct.db.save()
    counts = Counter(chosen.values())
    summary = ", ".join(f"{n} {r}" for r, n in counts.most_common())
    if not full:
        return out, PassReport("schedule", "disabled", f"off in the spec: only the fallback thread binding a GPU "
                               f"kernel needs ({summary})", {"kernels": chosen})
    how = "Gensor construction (analytical, no GPU timing) + dlight GPU rules" if construct else "dlight GPU rules"
    mma = sum(str(plan).count("tensor-core") for plan in plans.values())
    if mma:
        summary += f"; {mma} fp16 matmul(s) on tensor cores (wmma), grid phases included"
    return out, PassReport("schedule", "applied", f"{how} for {target.sm}: {summary}",
                           {"scheduler": "gensor" if construct else "rules", "kernels": plans})
