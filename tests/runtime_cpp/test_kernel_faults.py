"""Kernels that fail or misbehave, in a package written by hand around a small C kernels.so (the
packager's glue + kernels below, support/synthetic.py): a failure in a worker thread's parallel task reaches the caller
with its text, and the weights are read-only memory (a kernel that writes them faults instead of
corrupting them for every later run). The packrt-run used is the cnn package's."""
from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest

from support.packrt import cli, one_line_error, run
from support.synthetic import synthetic_package as _synthetic

pytestmark = pytest.mark.slow

KERNELS_C = r"""
#include <stdint.h>
typedef struct { int32_t type_index; uint32_t pad; void* v_ptr; } Any;   /* TVMFFIAny */
typedef struct { void* data; } TensorHead;                                /* DLTensor's first field */
typedef struct { void* sync_handle; int32_t num_task; } Env;
typedef int (*Lambda)(int task_id, Env* env, void* cdata);
int (*__TVMBackendParallelLaunch)(Lambda, void*, int) = 0;                /* hook set by the runtime */
void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* msg);     /* from the glue */

static int task(int id, Env* env, void* cdata) {
  if (id == 1) { TVMFFIErrorSetRaisedFromCStr("ValueError", "task one failed on purpose"); return -1; }
  return 0;
}
int __tvm_ffi_fail_in_worker(void* self, const Any* args, int32_t n, Any* r) {
  return __TVMBackendParallelLaunch(task, 0, 2);
}
int __tvm_ffi_copy(void* self, const Any* args, int32_t n, Any* r) {
  float* in = ((TensorHead*)args[0].v_ptr)->data;
  float* out = ((TensorHead*)args[1].v_ptr)->data;
  for (int i = 0; i < 4; ++i) out[i] = in[i];
  return 0;
}
int __tvm_ffi_write_first_arg(void* self, const Any* args, int32_t n, Any* r) {
  float* w = ((TensorHead*)args[0].v_ptr)->data;
  w[0] = 42.0f;
  return __tvm_ffi_copy(self, args, n, r);
}
"""


def synthetic_package(root: Path, symbol: str, input_storage: str) -> Path:
    return _synthetic(root, symbol, input_storage, kernels_c=KERNELS_C)


def test_synthetic_package_runs(packages, tmp_path, x_npy):
    pkg = synthetic_package(tmp_path / "pkg", "copy", "arena")
    r = run([*cli(packages["cnn"]), pkg, "--input", f"x={x_npy}", "--output-dir", tmp_path / "out", "--iters", "1"])
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), [1, 2, 3, 4])


def test_a_worker_tasks_error_reaches_the_caller(packages, tmp_path, x_npy):
    pkg = synthetic_package(tmp_path / "pkg", "fail_in_worker", "arena")
    r = run([*cli(packages["cnn"]), pkg, "--input", f"x={x_npy}", "--threads", "2", "--iters", "1"])
    one_line_error(r, 1, "kernel 'fail_in_worker' (step 0) failed", "ValueError: task one failed on purpose",
                   "in parallel task 1")


def test_weights_are_read_only(packages, tmp_path, x_npy):
    pkg = synthetic_package(tmp_path / "pkg", "write_first_arg", "weights")
    r = run([*cli(packages["cnn"]), pkg, "--input", f"x={x_npy}", "--iters", "1"])
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stderr)
