"""gpu_kernel_fault: what makes a scheduled GPU kernel unfit to ship, found on the compacted form
before CUDA code exists: a shared or local write that can leave its buffer (given thread and loop
extents and the guards around it), and static shared memory over the per-block limit."""
from __future__ import annotations

from tvm.script import tirx as T

from packager.optimize.schedule.tir_util import gpu_kernel_fault


@T.prim_func
def unguarded(a: T.Buffer((72,), "float32"), b: T.Buffer((8,), "float32")):
    bx = T.launch_thread("blockIdx.x", 1)
    ty = T.launch_thread("threadIdx.y", 16)
    s = T.alloc_buffer((8,), "float32", scope="shared")
    s[ty] = a[ty]                         # 16 rows of threads, 8 slots
    b[0] = s[0]


@T.prim_func
def guarded(a: T.Buffer((72,), "float32"), b: T.Buffer((8,), "float32")):
    bx = T.launch_thread("blockIdx.x", 1)
    ty = T.launch_thread("threadIdx.y", 16)
    s = T.alloc_buffer((8,), "float32", scope="shared")
    if ty < 8:
        s[ty] = a[ty]
    b[0] = s[0]


@T.prim_func
def fused_guard(a: T.Buffer((72,), "float32"), b: T.Buffer((8,), "float32")):
    bx = T.launch_thread("blockIdx.x", 1)
    tx = T.launch_thread("threadIdx.x", 36)
    s = T.alloc_buffer((5,), "float32", scope="shared")
    for f0 in range(2):
        if f0 * 36 + tx < 45:             # a cooperative load's guard on the fused index ...
            s[(f0 * 36 + tx) // 9] = a[f0 * 36 + tx]      # ... carried through the division
    b[0] = s[0]


@T.prim_func
def big(a: T.Buffer((16384,), "float32"), b: T.Buffer((1,), "float32")):
    bx = T.launch_thread("blockIdx.x", 1)
    tx = T.launch_thread("threadIdx.x", 128)
    s = T.alloc_buffer((16384,), "float32", scope="shared")
    for i in range(128):
        s[i * 128 + tx] = a[i * 128 + tx]
    b[0] = s[0]


def test_a_write_that_can_leave_its_buffer_is_found():
    assert gpu_kernel_fault(unguarded, 48 * 1024) == \
        "a write to s can leave it (dimension 0: index in [0, 15], extent 8)"


def test_guards_are_taken_into_account():
    assert gpu_kernel_fault(guarded, 48 * 1024) is None
    assert gpu_kernel_fault(fused_guard, 48 * 1024) is None


def test_static_shared_memory_is_bounded_per_block():
    assert gpu_kernel_fault(big, 64 * 1024) is None
    assert gpu_kernel_fault(big, 48 * 1024) == \
        "65536 bytes of shared memory per block after buffer compaction (limit 49152)"
