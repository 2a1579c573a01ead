// A loaded package target: plan + kernels + weights + thread pool, and the executor that runs
// the plan's steps on caller buffers. Scratch memory (the arena) belongs to an execution
// context; concurrent runs take different contexts, so one model serves many threads.
#pragma once
#include <packrt/packrt.h>
#include <tvm/ffi/c_api.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "buffer.h"
#include "cpu_backend.h"
#include "cuda_backend.h"
#include "package.h"
#include "plan.h"
#include "thread_pool.h"

namespace packrt {

class Model {
 public:
  Model(const std::string& package_dir, const packrt_options& options);

  const std::string& name() const { return name_; }
  const std::string& id() const { return id_; }
  const std::string& target() const { return target_; }
  const char* device() const { return cuda_ ? "cuda" : "cpu"; }
  int num_threads() const { return pool_->num_threads(); }
  const Plan& plan() const { return plan_; }

  void run(const packrt_tensor* inputs, int num_inputs, packrt_tensor* outputs, int num_outputs);
  // CUDA targets only: inputs/outputs hold device pointers; queued on `stream` (see packrt_run_device).
  void run_device(const packrt_tensor* inputs, int num_inputs, packrt_tensor* outputs, int num_outputs, void* stream);
  int select_profile(const packrt_tensor* inputs, int num_inputs) const;

  // Per-step wall time, accumulated while profiling is on (see packrt_set_profiling).
  void set_profiling(bool on);
  struct StepTime {
    double total_ms = 0;
    int64_t runs = 0;
  };
  StepTime step_time(int profile, int step) const;

 private:
  struct Context {
    int profile = 0;
    AlignedBuffer arena;
    std::vector<DLTensor> tensors;
    std::vector<std::vector<TVMFFIAny>> args;  // per step, prebuilt
  };

  struct Binding {
    int profile;
    std::vector<int> in_order, out_order;  // plan I/O slot -> caller array index
  };
  Binding bind(const packrt_tensor* inputs, int num_inputs, packrt_tensor* outputs, int num_outputs) const;
  void fill_output_info(const Binding& b, packrt_tensor* outputs) const;
  void record_times(int profile, const std::vector<double>& ms);
  int match_profile(const packrt_tensor* inputs, const std::vector<int>& order) const;
  std::vector<int> bind_order(const packrt_tensor* ts, int n, const std::vector<PlanIO>& ios, const char* what) const;
  std::unique_ptr<Context> acquire(int profile);
  void release(std::unique_ptr<Context> ctx);
  void execute(Context& ctx);

  std::string name_, id_, target_;
  Plan plan_;
  std::unique_ptr<KernelLibrary> kernels_;
  std::vector<PackedKernel> fns_;
  AlignedBuffer weights_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<CudaExecutor> cuda_;  // set for CUDA targets (then kernels_/fns_ stay empty)
  std::atomic<bool> profiling_{false};
  mutable std::mutex profile_mu_;
  std::vector<std::vector<StepTime>> step_times_;  // per profile, per step
  std::mutex contexts_mu_;
  std::vector<std::vector<std::unique_ptr<Context>>> free_contexts_;  // per profile
};

}  // namespace packrt
