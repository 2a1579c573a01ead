"""Gensor (construction-based scheduling): a kernel's workload (workload.py), tile plans built by
walking its memory levels (plan.py, walk.py), scored by the CPU and GPU cost models
(cpu_model.py, gpu_model.py), lowered to scheduled TIR (cpu_lower.py, gpu_lower.py); cpu.py and
gpu.py choose among the top-k plans (timed on the CPU where the target runs)."""
