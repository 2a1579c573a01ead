// plan.json in memory: the static, pre-planned execution of one target (see the packager's
// packager/emit/plan.py for the writer). Parsing validates every index and byte range.
#pragma once
#include <packrt/packrt.h>

#include <cstdint>
#include <string>
#include <vector>

namespace packrt {

struct PlanTensor {
  int32_t dtype = PACKRT_DTYPE_UNKNOWN;  // packrt_dtype
  std::vector<int64_t> shape;
  bool in_weights = false;               // false: arena
  uint64_t offset = 0, nbytes = 0;
};

struct PlanIO {
  std::string name;
  int tensor = -1;
};

struct PlanStep {
  // kAssemble moves nothing: its parts (written in place by earlier steps) tile its output
  enum Kind { kKernel, kCopy, kAssemble } kind = kKernel;
  int kernel = -1;        // kKernel: index into Plan::kernels
  std::vector<int> args;  // kKernel: tensor ids (inputs then outputs); kCopy: {src, dst}; kAssemble: {parts..., whole}
  int num_outputs = 1;    // how many of the last args the step writes
};

struct PlanProfile {
  std::string name;
  uint64_t arena_bytes = 0;
  std::vector<PlanTensor> tensors;
  std::vector<PlanIO> inputs, outputs;
  std::vector<PlanStep> steps;
};

// One device-kernel launch of a CUDA plan kernel. args[i] >= 0: the kernel's parameter args[i]
// (an index into the step's tensor list); args[i] < 0: scratch buffer -(args[i] + 1).
struct PlanLaunch {
  std::string function;
  std::vector<int> args;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  unsigned shared_bytes = 0;
  bool cooperative = false;  // grid-synchronized: cuLaunchCooperativeKernel, every block co-resident
};

struct PlanKernel {
  std::string name, symbol;
  int num_args = 0;
  bool together = false;             // CPU: "parallel": "together" (calls the parallel barrier)
  std::vector<PlanLaunch> launches;  // CUDA plans only
  std::vector<uint64_t> workspace;   // CUDA plans only: scratch buffer sizes
};

struct Plan {
  std::string target;
  std::string device = "cpu";  // "cpu" | "cuda"
  std::string module;          // CUDA: the fatbin, relative to the plan's folder
  uint64_t weights_bytes = 0;
  std::vector<PlanKernel> kernels;
  std::vector<PlanProfile> profiles;
};

// Parses and validates plan.json text; `where` names the file in error messages.
Plan parse_plan(const char* text, size_t size, const std::string& where);

int32_t dtype_from_name(const std::string& name);
size_t dtype_size(int32_t dtype);
const char* dtype_name(int32_t dtype);

}  // namespace packrt
