"""Scheduling: the contract every technique calls (contract.py: KernelScheduler; registry.py
maps a target's kind to its implementation, cpu.py or cuda.py), Gensor's construction-based
scheduler (gensor/), the rule-based CPU and GPU schedules (rules/), timing, the tuning database
and the untimed check (measure/), and level 3's measured tuning with ETO's reuse (tuning/);
shared TIR helpers (tir_util.py), GPU grid phases (phases.py), hardware models (hardware.py)."""
