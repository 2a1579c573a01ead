// The executor boundary: what runs a parsed plan on one kind of device. Model (model.h) binds
// the C API, checks the caller's tensors, picks the shape profile and hands the buffers, in the
// plan's input/output order, to its executor; it never looks at the device itself.
//
// An executor owns everything device-specific: the kernels (a dlopened kernels.so, a CUDA
// module), the weights (host memory, or uploaded to the GPU), the threads, and the per-profile
// scratch memory (CPU: a pool of arena contexts so concurrent runs do not share one; CUDA: one
// device arena per profile, runs serialized). Implementations: cpu/cpu_executor.h and
// cuda/cuda_executor.h; open_executor() below is the only place that chooses between them.
#pragma once
#include <packrt/packrt.h>

#include <memory>
#include <vector>

#include "buffer.h"
#include "package.h"
#include "plan.h"

namespace packrt {

// Every run takes `step_ms`: nullptr, or (while profiling, see packrt_set_profiling) a vector
// with one slot per step of the profile, which the executor fills with each step's wall time.
class Executor {
 public:
  virtual ~Executor() = default;

  virtual packrt_device_type device_type() const = 0;
  virtual const char* device_name() const = 0;  // "cpu" | "cuda" (packrt_model_device)
  virtual int num_threads() const = 0;           // host threads a run uses

  // Runs `profile` on host buffers, one per plan input/output in plan order, each at least the
  // size of its plan tensor (checked by the caller; any alignment). Safe to call concurrently.
  virtual void run_host(int profile, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                        std::vector<double>* step_ms) = 0;

  // packrt_run_device's first check, made before the caller's tensors are looked at: throws
  // PACKRT_ERROR_INVALID_ARGUMENT when this executor cannot take device pointers.
  virtual void check_device_run() const = 0;
  // Runs `profile` on device pointers (same order and sizes as run_host), queued on `stream`
  // (nullptr: the executor's own); returns when the outputs are ready.
  virtual void run_device(int profile, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                          void* stream, std::vector<double>* step_ms) = 0;
};

// What an executor is opened with: the package and the target it selected, the parsed plan
// (outlives the executor), the weights file's bytes (size already checked against the plan;
// the executor keeps or uploads them) and the caller's options.
struct ExecutorSource {
  const Package& package;
  const TargetEntry& target;
  const Plan& plan;
  AlignedBuffer weights;
  const packrt_options& options;
};

// The executor for the plan's device ("cpu" | "cuda"); fails if the target's kind disagrees.
std::unique_ptr<Executor> open_executor(ExecutorSource source);

}  // namespace packrt
