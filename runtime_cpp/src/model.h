// A loaded package target: the C API's model. It binds the caller's tensors to the plan's
// inputs and outputs, picks the shape profile, keeps the per-step profile, and hands the run to
// its executor (executor.h), which owns the kernels, weights, threads and scratch memory.
#pragma once
#include <packrt/packrt.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "executor.h"
#include "plan.h"

namespace packrt {

class Model {
 public:
  Model(const std::string& package_dir, const packrt_options& options);

  const std::string& name() const { return name_; }
  const std::string& id() const { return id_; }
  const std::string& manifest_sha256() const { return manifest_sha256_; }
  const std::string& target() const { return target_; }
  const char* device() const { return executor_->device_name(); }
  int num_threads() const { return executor_->num_threads(); }
  const Plan& plan() const { return plan_; }

  void run(const packrt_tensor* inputs, int num_inputs, packrt_tensor* outputs, int num_outputs);
  // Inputs/outputs hold device pointers; queued on `stream` (see packrt_run_device).
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
  struct Binding {
    int profile;
    std::vector<int> in_order, out_order;  // plan I/O slot -> caller array index
    std::vector<const void*> inputs;       // caller buffers in plan order
    std::vector<void*> outputs;
  };
  Binding bind(const packrt_tensor* inputs, int num_inputs, packrt_tensor* outputs, int num_outputs) const;
  void fill_output_info(const Binding& b, packrt_tensor* outputs) const;
  template <typename Run>
  void timed(int profile, Run&& run);  // run(step_ms), recording the step times while profiling
  void record_times(int profile, const std::vector<double>& ms);
  int match_profile(const packrt_tensor* inputs, const std::vector<int>& order) const;
  std::vector<int> bind_order(const packrt_tensor* ts, int n, const std::vector<PlanIO>& ios, const char* what) const;

  std::string name_, id_, manifest_sha256_, target_;
  Plan plan_;
  std::unique_ptr<Executor> executor_;
  std::atomic<bool> profiling_{false};
  mutable std::mutex profile_mu_;
  std::vector<std::vector<StepTime>> step_times_;  // per profile, per step
};

}  // namespace packrt
