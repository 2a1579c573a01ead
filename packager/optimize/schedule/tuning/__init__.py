"""Measured tuning at level 3 (tune.py, progress.py), ETO's program reuse between similar kernels
(reuse.py) and bridge operators (bridge.py)."""
