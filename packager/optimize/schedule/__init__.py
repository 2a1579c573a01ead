"""The `schedule` pass (passes.py, one entry per target kind): Gensor's construction-based scheduler
(plan, workload, walk, hardware, cpu/gpu model + lowering, measure, database) over the rule-based
CPU and GPU schedules (rules_cpu, rules_gpu), sharing TIR helpers (tir_util)."""
