"""The rule-based schedules: CPU rules (cpu.py, with its reduction-epilogue, row-region,
row-reduction and transpose rules and tile padding), GPU rules (gpu.py, dlight's)."""
