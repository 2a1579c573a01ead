"""The runtime's thread pool on a shared machine (runtime_cpp/src/cpu/thread_pool.cpp), through
packages written by hand (support/synthetic.py): a parallel loop completes, every chunk run once,
while the pool's worker is held off its core; a kernel whose tasks meet at TVM's barrier runs
them together when its plan says so (and the packager says so from the code TVM emitted); a
barrier the plan does not announce fails the run instead of hanging it."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from support.packrt import cli, one_line_error, run
from support.synthetic import synthetic_package

pytestmark = pytest.mark.slow

HOLD_S = 5   # how long the worker is held; the run must finish well inside it

KERNELS_C = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
typedef struct { int32_t type_index; uint32_t pad; void* v_ptr; } Any;
typedef struct { void* data; } TensorHead;
typedef struct { void* sync_handle; int32_t num_task; } Env;
typedef int (*Lambda)(int task_id, Env* env, void* cdata);
int (*__TVMBackendParallelLaunch)(Lambda, void*, int) = 0;
int TVMBackendParallelBarrier(int task_id, Env* env);       /* the glue's */

#define N 1000
static int marks[N], tasks;
static volatile int held;

static void hold(int sig) {                                  /* a worker the OS does not run */
  (void)sig;
  __atomic_fetch_add(&held, 1, __ATOMIC_SEQ_CST);
  struct timespec t = {HOLD_S, 0};
  nanosleep(&t, 0);
}

static int mark(int id, Env* env, void* cdata) {             /* TVM's split of a loop by num_task */
  int step = (N + env->num_task - 1) / env->num_task, lo = id * step, hi = lo + step < N ? lo + step : N;
  for (int i = lo; i < hi; ++i) __atomic_fetch_add(&marks[i], 1, __ATOMIC_RELAXED);
  __atomic_store_n(&tasks, env->num_task, __ATOMIC_RELAXED);
  return 0;
}

/* Holds every other thread of the process in a signal handler, then runs a parallel loop:
   y = [elements marked exactly once, num_task, threads held, 0]. */
int __tvm_ffi_hold_workers(void* self, const Any* args, int32_t n, Any* r) {
  struct sigaction sa = {0};
  sa.sa_handler = hold;
  sigaction(SIGUSR1, &sa, 0);
  pid_t me = (pid_t)syscall(SYS_gettid);
  int others = 0;
  DIR* d = opendir("/proc/self/task");
  for (struct dirent* e; (e = readdir(d));) {
    int tid = atoi(e->d_name);
    if (tid > 0 && tid != me && syscall(SYS_tgkill, getpid(), tid, SIGUSR1) == 0) ++others;
  }
  closedir(d);
  for (int i = 0; i < 10000 && __atomic_load_n(&held, __ATOMIC_SEQ_CST) < others; ++i) usleep(1000);
  for (int i = 0; i < N; ++i) marks[i] = 0;
  int rc = __TVMBackendParallelLaunch(mark, 0, 0);
  float* y = ((TensorHead*)args[1].v_ptr)->data;
  int once = 0;
  for (int i = 0; i < N; ++i) once += marks[i] == 1;
  y[0] = (float)once; y[1] = (float)tasks; y[2] = (float)held; y[3] = 0;
  return rc;
}

static int meet(int id, Env* env, void* cdata) { return TVMBackendParallelBarrier(id, env); }
int __tvm_ffi_barrier_unannounced(void* self, const Any* args, int32_t n, Any* r) {
  return __TVMBackendParallelLaunch(meet, 0, 0);
}
""".replace("HOLD_S", str(HOLD_S))


def test_a_parallel_loop_completes_while_the_worker_is_held(packages, tmp_path, x_npy):
    pkg = synthetic_package(tmp_path / "pkg", "hold_workers", kernels_c=KERNELS_C)
    stats = tmp_path / "stats.json"
    r = run([*cli(packages["cnn"]), pkg, "--input", f"x={x_npy}", "--output-dir", tmp_path / "out",
             "--threads", "2", "--warmup", "0", "--iters", "1", "--json", stats], timeout=4 * HOLD_S)
    assert r.returncode == 0, r.stderr
    once, tasks, held, _ = np.load(tmp_path / "out" / "y.npy")
    assert held >= 1 and tasks >= 2             # the worker was held, and the loop was split
    assert once == 1000                         # every element by exactly one chunk
    # the old pool waited for the held worker's own task: at least HOLD_S
    assert json.loads(stats.read_text())["latency_ms"][0] < HOLD_S * 1000 / 2


def test_a_barrier_the_plan_does_not_announce_fails_instead_of_hanging(packages, tmp_path, x_npy):
    pkg = synthetic_package(tmp_path / "pkg", "barrier_unannounced", kernels_c=KERNELS_C)
    r = run([*cli(packages["cnn"]), pkg, "--input", f"x={x_npy}", "--threads", "2", "--iters", "3"], timeout=60)
    one_line_error(r, 1, "kernel 'barrier_unannounced' (step 0) failed", "TVMBackendParallelBarrier",
                   "\"parallel\": \"together\"")


def test_tvm_barrier_kernels_are_marked_and_run_together(packages, tmp_path, monkeypatch):
    """Two parallel loops with a barrier between them (TVM's parallel_launch_point): the second
    reads what other tasks wrote in the first, so without all tasks at the barrier it goes wrong.
    The two kernels are compiled into two objects (as on a 2-core machine) and linked."""
    from tvm.script import tirx as T

    from packager.codegen.cpu import build_objects, link_kernels
    from packager.optimize.schedule.measure import compile as comp
    from packager.spec import TargetSpec
    from packager.targets import resolve

    @T.prim_func
    def shifted(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32"), c: T.Buffer((64,), "float32")):
        with T.attr(0, "pragma_parallel_launch_point", 1):
            with T.attr(0, "pragma_parallel_barrier_when_finish", 1):
                for i in T.parallel(64):
                    b[i] = a[i] + T.float32(1)
            for j in T.parallel(64):
                c[j] = b[63 - j] * T.float32(2)

    @T.prim_func
    def doubled(a: T.Buffer((64,), "float32"), c: T.Buffer((64,), "float32")):
        for i in T.parallel(64):
            c[i] = a[i] * T.float32(2)

    target = resolve(TargetSpec("x86-64", {}, "test"))
    monkeypatch.setattr(comp, "cores", lambda: 2)
    monkeypatch.setattr(comp, "MIN_PER_MODULE", 1)
    objs, together = build_objects({"shifted": shifted, "doubled": doubled}, target, tmp_path / "kernels.o")
    assert together == ["shifted"] and len(objs) == 2
    link_kernels(objs, target, tmp_path / "kernels.so")
    x = np.arange(64, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    pkg = synthetic_package(tmp_path / "pkg", "shifted", kernels_so=tmp_path / "kernels.so", n=64, scratch=True,
                            kernel_fields={"parallel": "together"})
    for _ in range(3):
        r = run([*cli(packages["cnn"]), pkg, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "out",
                 "--threads", "2", "--iters", "20"], timeout=60)
        assert r.returncode == 0, r.stderr
        np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), (x[::-1] + 1) * 2)


def test_a_bad_wait_setting_is_one_line(packages, tmp_path, x_npy):
    pkg = synthetic_package(tmp_path / "pkg", "hold_workers", kernels_c=KERNELS_C)
    r = run([*cli(packages["cnn"]), pkg, "--input", f"x={x_npy}"], env={**os.environ, "PACKRT_SPIN_US": "abc"})
    one_line_error(r, 2, "PACKRT_SPIN_US='abc'", "microseconds")
