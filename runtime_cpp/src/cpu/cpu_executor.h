// The CPU executor: a target's kernels.so, the weights in host memory and a thread pool. A run
// replays the plan's steps, calling each kernel with prebuilt TVM-FFI arguments. Scratch memory
// (the arena) belongs to an execution context; concurrent runs take different contexts, so one
// model serves many threads.
#pragma once
#include <tvm/ffi/c_api.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "buffer.h"
#include "cpu/kernel_library.h"
#include "cpu/thread_pool.h"
#include "executor.h"
#include "plan.h"

namespace packrt {

class CpuExecutor final : public Executor {
 public:
  // `target`: the target's name (for messages); `kernels`: its kernels.so's checked bytes;
  // `weights`: the plan's weights (kept); `num_threads`: pool size, 0 for one thread per core
  // (capped at kMaxThreads).
  CpuExecutor(const Plan& plan, const std::string& target, const AlignedBuffer& kernels, size_t kernels_size,
              const std::string& kernels_label, AlignedBuffer weights, int num_threads);

  packrt_device_type device_type() const override { return PACKRT_DEVICE_CPU; }
  const char* device_name() const override { return "cpu"; }
  int num_threads() const override { return pool_.num_threads(); }

  void run_host(int profile, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                std::vector<double>* step_ms) override;
  void check_device_run() const override;
  void run_device(int profile, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                  void* stream, std::vector<double>* step_ms) override;

 private:
  struct Context {
    int profile = 0;
    AlignedBuffer arena;
    std::vector<DLTensor> tensors;
    std::vector<std::vector<TVMFFIAny>> args;  // per step, prebuilt
  };

  std::unique_ptr<Context> acquire(int profile);
  void release(std::unique_ptr<Context> ctx);
  void execute(Context& ctx, std::vector<double>* step_ms);

  const Plan& plan_;
  std::string target_;
  KernelLibrary kernels_;
  std::vector<PackedKernel> fns_;  // per plan kernel
  AlignedBuffer weights_;
  ThreadPool pool_;
  std::mutex contexts_mu_;
  std::vector<std::vector<std::unique_ptr<Context>>> free_contexts_;  // per profile
};

// Checks the target's kernels.so (size, sha256 if asked) and opens it.
std::unique_ptr<Executor> open_cpu_executor(ExecutorSource& source);

}  // namespace packrt
