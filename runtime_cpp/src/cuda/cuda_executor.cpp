#include "cuda/cuda_executor.h"

#include <algorithm>
#include <chrono>

#include "error.h"

namespace packrt {
namespace {

constexpr uint64_t kDeviceAlign = 256;             // cuMemAlloc's own alignment
constexpr int kAttrMaxDynamicShared = 8;           // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr unsigned kStreamNonBlocking = 1;         // CU_STREAM_NON_BLOCKING
constexpr int kCaptureThreadLocal = 1;             // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
constexpr int kAttrMultiprocessors = 16;           // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int kAttrCooperativeLaunch = 95;         // CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH

uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

template <typename P>
std::vector<CUdeviceptr> device_ptrs(const std::vector<P*>& ptrs) {
  std::vector<CUdeviceptr> out;
  for (P* p : ptrs) out.push_back(reinterpret_cast<CUdeviceptr>(p));
  return out;
}

}  // namespace

class CudaExecutor::Scope {
 public:
  explicit Scope(const CudaExecutor& e) : cu_(e.cu_) { cuda_check(cu_.cuCtxPushCurrent(e.ctx_), "cuCtxPushCurrent"); }
  ~Scope() {
    CUcontext prev = nullptr;
    cu_.cuCtxPopCurrent(&prev);
  }

 private:
  const CudaDriver& cu_;
};

CudaExecutor::CudaExecutor(const Plan& plan, const void* image, const uint8_t* weights, uint64_t weights_bytes,
                           int device, bool graphs)
    : plan_(plan), cu_(cuda_driver()), graphs_(graphs) {
  std::string why;
  sm_ = cuda_device_sm(device, &why);
  if (sm_ < 0) fail(PACKRT_ERROR_UNSUPPORTED, why);
  cuda_check(cu_.cuDeviceGet(&device_, device), "cuDeviceGet");
  cuda_check(cu_.cuDevicePrimaryCtxRetain(&ctx_, device_), "cuDevicePrimaryCtxRetain");
  try {
    Scope scope(*this);
    CUresult r = cu_.cuModuleLoadData(&module_, image);
    if (r != 0) {
      const char* msg = nullptr;
      cu_.cuGetErrorString(r, &msg);
      fail(PACKRT_ERROR_UNSUPPORTED, "target '" + plan.target + "': the GPU (sm_" + std::to_string(sm_) +
                                         ") cannot load its kernels (" + (msg ? msg : "error") +
                                         "); build the package for this GPU's architecture");
    }
    for (const auto& k : plan.kernels) {
      std::vector<CUfunction> fns;
      std::vector<unsigned> grids;
      for (const auto& l : k.launches) {
        CUfunction f = nullptr;
        if (cu_.cuModuleGetFunction(&f, module_, l.function.c_str()) != 0)
          fail(PACKRT_ERROR_CORRUPT_PACKAGE, "kernels.fatbin has no function '" + l.function + "' (kernel '" + k.name + "')");
        // Set for any dynamic shared memory, not only past 48 KB: a launch needs the opt-in once its
        // dynamic and static shared memory together pass 48 KB (the tensor-core tiles stage the
        // accumulator statically beside dynamic operand stages).
        if (l.shared_bytes > 0)
          cuda_check(cu_.cuFuncSetAttribute(f, kAttrMaxDynamicShared, static_cast<int>(l.shared_bytes)),
                     "cuFuncSetAttribute(dynamic shared memory)");
        grids.push_back(l.cooperative ? cooperative_grid(f, l, k.name) : l.grid[0]);
        fns.push_back(f);
      }
      functions_.push_back(std::move(fns));
      grids_.push_back(std::move(grids));
      std::vector<uint64_t> offs;
      uint64_t total = 0;
      for (uint64_t bytes : k.workspace) {
        offs.push_back(total);
        total += round_up(bytes, kDeviceAlign);
      }
      scratch_offsets_.push_back(std::move(offs));
      scratch_bytes_ = std::max(scratch_bytes_, total);  // steps run one after another: one region serves all
    }
    cuda_check(cu_.cuStreamCreate(&stream_, kStreamNonBlocking), "cuStreamCreate");
    if (weights_bytes) {
      cuda_check(cu_.cuMemAlloc(&weights_, weights_bytes), "cuMemAlloc(weights)");
      cuda_check(cu_.cuMemcpyHtoD(weights_, weights, weights_bytes), "uploading weights");
    }
    profiles_.resize(plan.profiles.size());
  } catch (...) {
    release();
    throw;
  }
}

CudaExecutor::~CudaExecutor() { release(); }

// A grid barrier waits for every block of the grid: all of them must be resident at once. The
// build sized the grid from the target's table; this GPU's driver says how many blocks it holds
// (a smaller GPU of the architecture, another shared-memory carveout). Every block of a
// cooperative kernel walks its phases' blocks with a grid-stride loop, so a smaller grid computes
// the same: the grid is lowered to what fits, and the plan refused when not one block does.
unsigned CudaExecutor::cooperative_grid(CUfunction f, const PlanLaunch& l, const std::string& kernel) const {
  const std::string what = "target '" + plan_.target + "': kernel '" + kernel + "'";
  if (l.grid[1] != 1 || l.grid[2] != 1)
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, what + ": a cooperative launch has a one-dimensional grid");
  int cooperative = 0, sms = 0, per_sm = 0;
  cuda_check(cu_.cuDeviceGetAttribute(&cooperative, kAttrCooperativeLaunch, device_), "cuDeviceGetAttribute");
  if (!cooperative)
    fail(PACKRT_ERROR_UNSUPPORTED, what + " synchronizes its whole grid, and this GPU cannot launch cooperative "
                                          "kernels; build the package with optimize.passes.global_fusion off");
  cuda_check(cu_.cuDeviceGetAttribute(&sms, kAttrMultiprocessors, device_), "cuDeviceGetAttribute");
  const int threads = static_cast<int>(l.block[0] * l.block[1] * l.block[2]);
  cuda_check(cu_.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, threads, l.shared_bytes),
             "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  const uint64_t resident = static_cast<uint64_t>(std::max(per_sm, 0)) * static_cast<uint64_t>(std::max(sms, 0));
  if (resident == 0)
    fail(PACKRT_ERROR_UNSUPPORTED, what + " synchronizes its whole grid, but not one of its blocks (" +
                                       std::to_string(threads) + " threads, " + std::to_string(l.shared_bytes) +
                                       " B dynamic shared memory) fits an SM of this GPU; build the package for it");
  return static_cast<unsigned>(std::min<uint64_t>(l.grid[0], resident));
}

void CudaExecutor::release() noexcept {
  if (!ctx_) return;
  if (cu_.cuCtxPushCurrent(ctx_) == 0) {
    for (auto& p : profiles_) {
      if (p.graph) cu_.cuGraphExecDestroy(p.graph);
      if (p.arena) cu_.cuMemFree(p.arena);
      p = ProfileState{};
    }
    if (weights_) cu_.cuMemFree(weights_);
    if (stream_) cu_.cuStreamDestroy(stream_);
    if (module_) cu_.cuModuleUnload(module_);
    CUcontext prev = nullptr;
    cu_.cuCtxPopCurrent(&prev);
  }
  weights_ = 0;
  stream_ = nullptr;
  module_ = nullptr;
  cu_.cuDevicePrimaryCtxRelease(device_);
  ctx_ = nullptr;
}

CudaExecutor::ProfileState& CudaExecutor::ensure_arena(int profile) {
  ProfileState& ps = profiles_[profile];
  if (ps.arena) return ps;
  const PlanProfile& prof = plan_.profiles[profile];
  uint64_t bytes = round_up(prof.arena_bytes, kDeviceAlign) + scratch_bytes_;
  cuda_check(cu_.cuMemAlloc(&ps.arena, std::max<uint64_t>(bytes, kDeviceAlign)), "cuMemAlloc(arena)");
  ps.addr.resize(prof.tensors.size());
  for (size_t i = 0; i < prof.tensors.size(); ++i) {
    const PlanTensor& t = prof.tensors[i];
    ps.addr[i] = (t.in_weights ? weights_ : ps.arena) + t.offset;
  }
  return ps;
}

void CudaExecutor::enqueue_steps(int profile, const std::vector<CUdeviceptr>& addr, CUstream stream,
                                 std::vector<double>* step_ms) {
  const PlanProfile& prof = plan_.profiles[profile];
  const CUdeviceptr scratch = profiles_[profile].arena + round_up(prof.arena_bytes, kDeviceAlign);
  std::vector<CUdeviceptr> values;
  std::vector<void*> params;
  for (size_t s = 0; s < prof.steps.size(); ++s) {
    const PlanStep& step = prof.steps[s];
    auto t0 = std::chrono::steady_clock::now();
    if (step.kind == PlanStep::kAssemble) {
      // nothing to run: the producers of its parts wrote them in place
    } else if (step.kind == PlanStep::kCopy) {
      uint64_t n = prof.tensors[step.args[0]].nbytes;
      if (n) cuda_check(cu_.cuMemcpyDtoDAsync(addr[step.args[1]], addr[step.args[0]], n, stream), "copy step");
    } else {
      const PlanKernel& k = plan_.kernels[step.kernel];
      for (size_t li = 0; li < k.launches.size(); ++li) {
        const PlanLaunch& l = k.launches[li];
        values.resize(l.args.size());
        params.resize(l.args.size());
        for (size_t a = 0; a < l.args.size(); ++a) {
          int ref = l.args[a];
          values[a] = ref >= 0 ? addr[step.args[ref]] : scratch + scratch_offsets_[step.kernel][-ref - 1];
          params[a] = &values[a];
        }
        CUfunction f = functions_[step.kernel][li];
        CUresult r = l.cooperative
                         ? cu_.cuLaunchCooperativeKernel(f, grids_[step.kernel][li], 1, 1, l.block[0], l.block[1],
                                                         l.block[2], l.shared_bytes, stream, params.data())
                         : cu_.cuLaunchKernel(f, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2],
                                              l.shared_bytes, stream, params.data(), nullptr);
        if (r != 0) cuda_check(r, ("launching '" + l.function + "' (step " + std::to_string(s) + ")").c_str());
      }
    }
    if (step_ms) {
      cuda_check(cu_.cuStreamSynchronize(stream), ("step " + std::to_string(s)).c_str());
      (*step_ms)[s] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
  }
}

void CudaExecutor::run_host(int profile, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                            std::vector<double>* step_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  Scope scope(*this);
  ProfileState& ps = ensure_arena(profile);
  const PlanProfile& prof = plan_.profiles[profile];
  const std::vector<CUdeviceptr>& addr = ps.addr;  // fixed per profile: host runs bind nothing else
  for (size_t k = 0; k < prof.inputs.size(); ++k) {
    const PlanTensor& t = prof.tensors[prof.inputs[k].tensor];
    if (t.nbytes)
      cuda_check(cu_.cuMemcpyHtoDAsync(addr[prof.inputs[k].tensor], inputs[k], t.nbytes, stream_),
                 ("copying input '" + prof.inputs[k].name + "' to the GPU").c_str());
  }
  if (ps.graph && !step_ms) {
    cuda_check(cu_.cuGraphLaunch(ps.graph, stream_), "cuGraphLaunch");
  } else if (graphs_ && !step_ms && ps.runs >= 1 && capture_graph(profile, addr)) {
    cuda_check(cu_.cuGraphLaunch(ps.graph, stream_), "cuGraphLaunch");
  } else {
    enqueue_steps(profile, addr, stream_, step_ms);
  }
  for (size_t k = 0; k < prof.outputs.size(); ++k) {
    const PlanTensor& t = prof.tensors[prof.outputs[k].tensor];
    if (t.nbytes)
      cuda_check(cu_.cuMemcpyDtoHAsync(outputs[k], addr[prof.outputs[k].tensor], t.nbytes, stream_),
                 ("copying output '" + prof.outputs[k].name + "' from the GPU").c_str());
  }
  cuda_check(cu_.cuStreamSynchronize(stream_), "running the model on the GPU");
  ps.runs += 1;
}

// Captures the profile's steps into a CUDA graph (every address is fixed for this profile: arena +
// weights, so the graph stays valid). A driver that cannot capture a step (cooperative launches
// in graphs need a recent one) leaves graphs off for this model: steps are launched one by one.
bool CudaExecutor::capture_graph(int profile, const std::vector<CUdeviceptr>& addr) {
  CUgraph g = nullptr;
  cuda_check(cu_.cuStreamBeginCapture(stream_, kCaptureThreadLocal), "cuStreamBeginCapture");
  bool captured = true;
  try {
    enqueue_steps(profile, addr, stream_, nullptr);
  } catch (const Failure&) {
    captured = false;
  }
  CUresult r = cu_.cuStreamEndCapture(stream_, &g);
  if (captured && r == 0) r = cu_.cuGraphInstantiateWithFlags(&profiles_[profile].graph, g, 0);
  if (g) cu_.cuGraphDestroy(g);
  if (captured && r == 0) return true;
  profiles_[profile].graph = nullptr;
  graphs_ = false;
  return false;
}

void CudaExecutor::run_device(int profile, const std::vector<const void*>& input_ptrs,
                              const std::vector<void*>& output_ptrs, void* stream, std::vector<double>* step_ms) {
  const std::vector<CUdeviceptr> inputs = device_ptrs(input_ptrs), outputs = device_ptrs(output_ptrs);
  std::lock_guard<std::mutex> lock(mu_);
  Scope scope(*this);
  std::vector<CUdeviceptr> addr = ensure_arena(profile).addr;  // a copy: caller buffers replace I/O slots
  CUstream s = stream ? static_cast<CUstream>(stream) : stream_;
  const PlanProfile& prof = plan_.profiles[profile];
  // Aligned caller buffers are bound in place; others go through their arena slot.
  for (size_t k = 0; k < prof.inputs.size(); ++k) {
    int id = prof.inputs[k].tensor;
    if (!prof.tensors[id].nbytes) continue;
    if (inputs[k] % 64 == 0)
      addr[id] = inputs[k];
    else
      cuda_check(cu_.cuMemcpyDtoDAsync(addr[id], inputs[k], prof.tensors[id].nbytes, s), "staging an input");
  }
  std::vector<bool> staged(prof.outputs.size(), false);
  for (size_t k = 0; k < prof.outputs.size(); ++k) {
    int id = prof.outputs[k].tensor;
    staged[k] = prof.tensors[id].nbytes && outputs[k] % 64 != 0;
    if (prof.tensors[id].nbytes && !staged[k]) addr[id] = outputs[k];
  }
  enqueue_steps(profile, addr, s, step_ms);
  for (size_t k = 0; k < prof.outputs.size(); ++k)
    if (staged[k])
      cuda_check(cu_.cuMemcpyDtoDAsync(outputs[k], addr[prof.outputs[k].tensor],
                                       prof.tensors[prof.outputs[k].tensor].nbytes, s),
                 "copying an output");
  // Wait even on a caller's stream: the arena is reused by the next run, which may come on another stream.
  cuda_check(cu_.cuStreamSynchronize(s), "running the model on the GPU");
}

std::unique_ptr<Executor> open_cuda_executor(ExecutorSource& source) {
  AlignedBuffer image = source.package.read(source.target.kernels);
  auto executor = std::make_unique<CudaExecutor>(source.plan, image.get(), source.weights.get(),
                                                 source.plan.weights_bytes, source.options.cuda_device,
                                                 source.options.cuda_graph != 0);
  source.weights.reset();  // uploaded to the GPU
  return executor;
}

}  // namespace packrt
