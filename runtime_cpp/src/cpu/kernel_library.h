// A CPU target's kernels.so (TVM LLVM kernels + the packager's glue), loaded with dlopen. The
// kernels call back into the runtime through hook pointers we set after loading: workspace
// allocation, parallel launch (into the thread pool of the model that is running) and barrier.
// The library's ABI (version, shared types) is include/packrt/kernel_abi.h.
#pragma once
#include <tvm/ffi/c_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cpu/thread_pool.h"

namespace packrt {

// int fn(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result): TVM-FFI packed ABI.
using PackedKernel = int (*)(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);

class KernelLibrary {
 public:
  // Loads kernels.so from its checked bytes (`label` names it in errors).
  KernelLibrary(const uint8_t* image, size_t size, const std::string& label);
  ~KernelLibrary();
  KernelLibrary(const KernelLibrary&) = delete;
  KernelLibrary& operator=(const KernelLibrary&) = delete;

  PackedKernel kernel(const std::string& symbol) const;  // throws if missing
  std::string last_error() const;                          // this thread's last kernel error
  // Sets this thread's kernel error to `text` ("Kind: message"): a worker's error, handed to the
  // thread that reports the failure.
  void set_error(const std::string& text) const;
  const char* (*error_reader() const)() { return last_error_; }

 private:
  static constexpr const char* kKernelPrefix = "__tvm_ffi_";
  void* own_symbol(const char* name, bool function) const;   // defined in kernels.so itself, or null
  void* handle_ = nullptr;
  int memfd_ = -1;
  const char* (*last_error_)() = nullptr;
  void (*set_error_)(const char* kind, const char* msg) = nullptr;
  std::string path_;
};

// Makes `pool` the target of parallel launches from `library`'s kernels run on this thread, for a scope.
class PoolScope {
 public:
  PoolScope(ThreadPool* pool, const KernelLibrary* library);
  ~PoolScope();
  // The kernel about to run calls the parallel barrier: its launches run one task per thread, together.
  void next_kernel(bool together);

 private:
  ThreadPool* previous_;
  const KernelLibrary* previous_library_;
};

}  // namespace packrt
