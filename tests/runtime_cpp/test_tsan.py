"""Concurrent C API calls on one model under ThreadSanitizer: libpackrt built with -fsanitize=thread
(support/sanitized.py, cached), driven by concurrent_runs.c: several threads running one model,
profiling toggled beside them, then several threads opening, running and closing the same package.

The kernels in kernels.so are not instrumented: TSan sees the runtime's own memory accesses
(thread pool, contexts, profiling, library loading) and the libc calls it intercepts.

By hand (after a run of this test has built the library, or build_sanitized_runtime("thread")):
    gcc -std=c11 -fsanitize=thread -g -O1 -o cr tests/runtime_cpp/concurrent_runs.c \\
        -Iruntime_cpp/include -L$LIBDIR -lpackrt -lpthread -Wl,-rpath,$LIBDIR
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ./cr PKG inputs.raw 4 200 4 10
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.helpers import REPO
from support.packrt import run
from support.sanitized import TSAN_CFLAGS, build_sanitized_runtime

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent

# 4 threads x 200 runs of one model, then 4 threads x 10 open/run/close: about 15 s on two busy cores.
THREADS, RUNS, OPENERS, OPENS = 4, 200, 4, 10


@pytest.fixture(scope="session")
def tsan_runtime() -> Path:
    """libpackrt.so built with TSan."""
    return build_sanitized_runtime("thread")


def test_concurrent_c_api_calls_under_tsan(packages, cnn_input, tsan_runtime, tmp_path):
    lib = tsan_runtime.parent
    exe = tmp_path / "concurrent_runs"
    r = run(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", *TSAN_CFLAGS.split(), "-o", exe,
             HERE / "concurrent_runs.c", f"-I{REPO / 'runtime_cpp' / 'include'}", f"-L{lib}", "-lpackrt",
             "-lpthread", f"-Wl,-rpath,{lib}"])
    assert r.returncode == 0, r.stderr
    cnn_input[1].tofile(tmp_path / "inputs.raw")                  # the cnn's one input, float32 [1,3,64,64]
    env = {**os.environ, "TSAN_OPTIONS": "halt_on_error=1 second_deadlock_stack=1"}
    r = run([exe, packages["cnn"], tmp_path / "inputs.raw", THREADS, RUNS, OPENERS, OPENS], timeout=300, env=env)
    assert r.returncode == 0 and "ThreadSanitizer" not in r.stderr, \
        f"exit {r.returncode}\nstdout: {r.stdout}\nstderr:\n{r.stderr[-20000:]}"
    assert f"{THREADS} threads x {RUNS} runs identical" in r.stdout, r.stdout
    assert f"{OPENERS} threads x {OPENS} open/run/close" in r.stdout, r.stdout
