"""Timing candidates where the target runs (timing.py: this machine or its RPC device, rpc.py),
the tuning database that keeps what was timed (database.py), and the check of kernels chosen
without timing against their unscheduled loops (check.py)."""
