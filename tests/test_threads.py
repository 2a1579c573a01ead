"""Kernels timed at build time run on as many threads as a package does (all online CPUs): TVM's
pool alone would start with half of them."""
from __future__ import annotations

import os
import subprocess
import sys


def test_build_time_timing_uses_every_cpu():
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    code = "import packager, tvm; print(tvm.get_global_func('runtime.NumThreads')())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) == os.cpu_count()


def test_a_users_thread_setting_wins():
    env = {**os.environ, "TVM_NUM_THREADS": "1"}
    code = "import packager, tvm; print(tvm.get_global_func('runtime.NumThreads')())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) == 1
