/* The contract between a CPU target's kernels.so and the runtime that loads it.
 *
 * The packager links kernel_glue/packrt_kernel_glue.c into every kernels.so; the runtime
 * (src/cpu/kernel_library.cpp) dlopens the library, refuses it unless
 * packrt_kernels_abi_version() returns PACKRT_KERNEL_ABI_VERSION, and sets the hook variables.
 * Both sides include this header: change the version whenever anything below changes.
 *
 * Plain C (the glue is compiled with `cc -std=c11` and no include flags: it reaches this file by
 * a relative path). */
#ifndef PACKRT_KERNEL_ABI_H_
#define PACKRT_KERNEL_ABI_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PACKRT_KERNEL_ABI_VERSION 1

/* Layout of TVM's TVMParallelGroupEnv (c_backend_api.h): kernels read num_task from it. */
typedef struct packrt_parallel_env {
  void* sync_handle;
  int32_t num_task;
} packrt_parallel_env;

/* Exported by the glue:
 *   int packrt_kernels_abi_version(void);          PACKRT_KERNEL_ABI_VERSION
 *   const char* packrt_kernels_last_error(void);   the calling thread's last kernel error
 *   packrt_parallel_barrier_fn packrt_parallel_barrier;   hook set by the runtime after dlopen */
typedef int (*packrt_parallel_barrier_fn)(int task_id, packrt_parallel_env* env);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PACKRT_KERNEL_ABI_H_ */
