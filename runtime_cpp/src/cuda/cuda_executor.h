// The CUDA executor: a target's kernels.fatbin loaded with the driver API, weights uploaded once,
// one device arena per shape profile (from the static memory plan) plus the kernels' scratch
// region, and one stream. A run replays the plan: cuLaunchKernel per device launch with the
// grid/block sizes and argument map the packager read from TVM's host code. Runs on one model
// are serialized (one stream, one arena per profile).
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/cuda_driver.h"
#include "executor.h"
#include "plan.h"

namespace packrt {

class CudaExecutor final : public Executor {
 public:
  // `image`: the fatbin bytes; `weights`: the plan's weights.bin; `device`: CUDA ordinal;
  // `graphs`: capture the kernel steps of each profile into a CUDA graph after its first run.
  CudaExecutor(const Plan& plan, const void* image, const uint8_t* weights, uint64_t weights_bytes, int device,
               bool graphs);
  ~CudaExecutor();
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  packrt_device_type device_type() const override { return PACKRT_DEVICE_CUDA; }
  const char* device_name() const override { return "cuda"; }
  int num_threads() const override { return 1; }

  // Host buffers, in the plan's input/output order: copied in and out through the device arena.
  void run_host(int profile, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                std::vector<double>* step_ms) override;
  void check_device_run() const override {}
  // Device pointers (CUdeviceptr values; zero-copy where 64-byte aligned) on `stream` (a CUstream;
  // nullptr: the model's own stream); returns when the results are ready.
  void run_device(int profile, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                  void* stream, std::vector<double>* step_ms) override;

  int device_sm() const { return sm_; }

 private:
  struct ProfileState {
    CUdeviceptr arena = 0;  // arena_bytes + scratch region
    std::vector<CUdeviceptr> addr;  // every plan tensor's device address (weights or arena)
    CUgraphExec graph = nullptr;
    int runs = 0;
  };
  class Scope;  // makes the model's context current for the calling thread

  void release() noexcept;
  ProfileState& ensure_arena(int profile);  // allocates the arena and tensor addresses on first use
  void enqueue_steps(int profile, const std::vector<CUdeviceptr>& addr, CUstream stream, std::vector<double>* step_ms);
  bool capture_graph(int profile, const std::vector<CUdeviceptr>& addr);  // false: graphs off, launch eagerly
  // The grid a cooperative launch runs with on this GPU (the plan's, lowered to what is resident).
  unsigned cooperative_grid(CUfunction f, const PlanLaunch& l, const std::string& kernel) const;

  const Plan& plan_;
  const CudaDriver& cu_;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  CUstream stream_ = nullptr;
  CUdeviceptr weights_ = 0;
  int sm_ = 0;
  bool graphs_ = false;
  uint64_t scratch_bytes_ = 0;
  std::vector<std::vector<uint64_t>> scratch_offsets_;      // per kernel, per workspace buffer
  std::vector<std::vector<CUfunction>> functions_;          // per kernel, per launch
  std::vector<std::vector<unsigned>> grids_;                // per kernel, per launch: cooperative grid.x
  std::vector<ProfileState> profiles_;
  std::mutex mu_;
};

// Reads the target's kernels.fatbin and opens it on options.cuda_device; uploads the weights.
std::unique_ptr<Executor> open_cuda_executor(ExecutorSource& source);

}  // namespace packrt
