/* Linked into every target's kernels.so by the packager. It makes the TVM-generated kernels
 * self-contained: the error sink and the barrier they call live here (no libtvm, no symbols
 * from the host process), and the runtime reaches them through the few exported names below.
 * The ABI version and the types shared with the runtime are in include/packrt/kernel_abi.h
 * (included by a relative path: the packager compiles this file with no include flags). */
#include <stdint.h>
#include <string.h>

#include "../include/packrt/kernel_abi.h"

#define EXPORT __attribute__((visibility("default")))

typedef packrt_parallel_env TVMParallelGroupEnv;

static __thread char g_error[2048];

static void append(size_t* len, const char* s) {
  size_t n = strlen(s);
  if (*len + n >= sizeof g_error) n = sizeof g_error - 1 - *len;
  memcpy(g_error + *len, s, n);
  *len += n;
  g_error[*len] = 0;
}

EXPORT int packrt_kernels_abi_version(void) { return PACKRT_KERNEL_ABI_VERSION; }
EXPORT const char* packrt_kernels_last_error(void) { return g_error; }

EXPORT void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  size_t len = 0;
  g_error[0] = 0;
  append(&len, kind ? kind : "Error");
  append(&len, ": ");
  for (int32_t i = 0; i < n; ++i)
    if (parts[i]) append(&len, parts[i]);
}

EXPORT void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* msg) {
  const char* parts[1] = {msg};
  TVMFFIErrorSetRaisedFromCStrParts(kind, parts, 1);
}

/* Set by the runtime after dlopen. */
EXPORT packrt_parallel_barrier_fn packrt_parallel_barrier = 0;

EXPORT int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* env) {
  return packrt_parallel_barrier ? packrt_parallel_barrier(task_id, env) : 0;
}
