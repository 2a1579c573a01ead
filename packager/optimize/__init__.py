"""Optimize: the pass pipeline as data (pipeline.py) and one module or folder per technique (simplify,
fastmath, fusion, layout/ = ALT, schedule/ = the schedule pass with Gensor and the rule-based
baselines)."""
