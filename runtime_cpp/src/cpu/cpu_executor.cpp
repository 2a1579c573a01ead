#include "cpu/cpu_executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "cpu_features.h"
#include "error.h"

namespace packrt {
namespace {

DLDataType to_dl(int32_t dtype) {
  switch (dtype) {
    case PACKRT_FLOAT32: return {kDLFloat, 32, 1};
    case PACKRT_FLOAT16: return {kDLFloat, 16, 1};
    case PACKRT_FLOAT64: return {kDLFloat, 64, 1};
    case PACKRT_INT8: return {kDLInt, 8, 1};
    case PACKRT_INT16: return {kDLInt, 16, 1};
    case PACKRT_INT32: return {kDLInt, 32, 1};
    case PACKRT_INT64: return {kDLInt, 64, 1};
    case PACKRT_UINT8: return {kDLUInt, 8, 1};
    case PACKRT_UINT16: return {kDLUInt, 16, 1};
    case PACKRT_BOOL: return {kDLBool, 8, 1};
    default: return {kDLFloat, 32, 1};
  }
}

alignas(64) uint8_t g_empty[64];  // data pointer for zero-byte tensors (kernels reject NULL)

std::vector<PackedKernel> resolve(const KernelLibrary& lib, const Plan& plan) {
  std::vector<PackedKernel> fns;
  for (const auto& k : plan.kernels) fns.push_back(lib.kernel(k.symbol));
  return fns;
}

}  // namespace

CpuExecutor::CpuExecutor(const Plan& plan, const std::string& target, const AlignedBuffer& kernels,
                         size_t kernels_size, const std::string& kernels_label, AlignedBuffer weights, int num_threads)
    : plan_(plan),
      target_(target),
      kernels_(kernels.get(), kernels_size, kernels_label),
      fns_(resolve(kernels_, plan)),
      weights_(std::move(weights)),
      pool_(num_threads > 0 ? std::min(num_threads, PACKRT_MAX_THREADS) : host_cores()),
      free_contexts_(plan.profiles.size()) {
  // Every profile's arena now, so a machine without the memory fails at open, not at the first
  // run (untouched pages cost address space only until a run uses them).
  for (size_t p = 0; p < plan.profiles.size(); ++p) release(acquire(static_cast<int>(p)));
}

std::unique_ptr<CpuExecutor::Context> CpuExecutor::acquire(int profile) {
  {
    std::lock_guard<std::mutex> l(contexts_mu_);
    auto& pool = free_contexts_[profile];
    if (!pool.empty()) {
      auto ctx = std::move(pool.back());
      pool.pop_back();
      return ctx;
    }
  }
  const PlanProfile& prof = plan_.profiles[profile];
  auto ctx = std::make_unique<Context>();
  ctx->profile = profile;
  try {
    ctx->arena = aligned_buffer(prof.arena_bytes);
  } catch (const std::bad_alloc&) {
    fail(PACKRT_ERROR_RUNTIME, "out of memory: cannot allocate the " + std::to_string(prof.arena_bytes) +
                                         "-byte arena of profile '" + prof.name + "'");
  }
  ctx->tensors.resize(prof.tensors.size());
  for (size_t i = 0; i < prof.tensors.size(); ++i) {
    const PlanTensor& t = prof.tensors[i];
    DLTensor& d = ctx->tensors[i];
    std::memset(&d, 0, sizeof d);
    uint8_t* base = t.in_weights ? weights_.get() : ctx->arena.get();
    d.data = t.nbytes ? base + t.offset : g_empty;
    d.device = {kDLCPU, 0};
    d.ndim = static_cast<int32_t>(t.shape.size());
    d.dtype = to_dl(t.dtype);
    d.shape = const_cast<int64_t*>(t.shape.data());
  }
  ctx->args.resize(prof.steps.size());
  for (size_t s = 0; s < prof.steps.size(); ++s) {
    if (prof.steps[s].kind != PlanStep::kKernel) continue;
    for (int id : prof.steps[s].args) {
      TVMFFIAny a;
      std::memset(&a, 0, sizeof a);
      a.type_index = kTVMFFIDLTensorPtr;
      a.v_ptr = &ctx->tensors[id];
      ctx->args[s].push_back(a);
    }
  }
  return ctx;
}

void CpuExecutor::release(std::unique_ptr<Context> ctx) {
  std::lock_guard<std::mutex> l(contexts_mu_);
  free_contexts_[ctx->profile].push_back(std::move(ctx));
}

void CpuExecutor::execute(Context& ctx, std::vector<double>* step_ms) {
  const PlanProfile& prof = plan_.profiles[ctx.profile];
  PoolScope scope(&pool_, &kernels_);
  for (size_t s = 0; s < prof.steps.size(); ++s) {
    const PlanStep& step = prof.steps[s];
    auto t0 = step_ms ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    if (step.kind == PlanStep::kAssemble) {
      // nothing to run: the producers of its parts wrote them in place
    } else if (step.kind == PlanStep::kCopy) {
      const PlanTensor& src = prof.tensors[step.args[0]];
      // memmove: an input and an output the caller bound to the same buffer may alias
      std::memmove(ctx.tensors[step.args[1]].data, ctx.tensors[step.args[0]].data, src.nbytes);
    } else {
      TVMFFIAny result;
      std::memset(&result, 0, sizeof result);
      auto& args = ctx.args[s];
      scope.next_kernel(plan_.kernels[step.kernel].together);
      if (fns_[step.kernel](nullptr, args.data(), static_cast<int32_t>(args.size()), &result) != 0)
        fail(PACKRT_ERROR_RUNTIME, "kernel '" + plan_.kernels[step.kernel].name + "' (step " + std::to_string(s) +
                                       ") failed: " + kernels_.last_error());
    }
    if (step_ms)
      (*step_ms)[s] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
}

void CpuExecutor::run_host(int profile, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                           std::vector<double>* step_ms) {
  const PlanProfile& prof = plan_.profiles[profile];
  std::unique_ptr<Context> ctx = acquire(profile);
  struct Release {  // give the context back even if a kernel fails
    CpuExecutor* e;
    std::unique_ptr<Context>& c;
    ~Release() { e->release(std::move(c)); }
  } release_guard{this, ctx};

  // Bind caller buffers: aligned ones are used in place, others are staged through the arena.
  std::vector<bool> out_direct(prof.outputs.size());
  for (size_t k = 0; k < prof.inputs.size(); ++k) {
    const PlanTensor& t = prof.tensors[prof.inputs[k].tensor];
    DLTensor& d = ctx->tensors[prof.inputs[k].tensor];
    if (!t.nbytes) continue;
    if (is_aligned(inputs[k])) {
      d.data = const_cast<void*>(inputs[k]);
    } else {
      d.data = ctx->arena.get() + t.offset;
      std::memcpy(d.data, inputs[k], t.nbytes);
    }
  }
  for (size_t k = 0; k < prof.outputs.size(); ++k) {
    const PlanTensor& t = prof.tensors[prof.outputs[k].tensor];
    DLTensor& d = ctx->tensors[prof.outputs[k].tensor];
    out_direct[k] = t.nbytes && is_aligned(outputs[k]);
    if (t.nbytes) d.data = out_direct[k] ? outputs[k] : ctx->arena.get() + t.offset;
  }

  execute(*ctx, step_ms);

  for (size_t k = 0; k < prof.outputs.size(); ++k) {
    const PlanTensor& t = prof.tensors[prof.outputs[k].tensor];
    if (t.nbytes && !out_direct[k]) std::memcpy(outputs[k], ctx->arena.get() + t.offset, t.nbytes);
  }
}

void CpuExecutor::check_device_run() const {
  fail(PACKRT_ERROR_INVALID_ARGUMENT, "target '" + target_ + "' runs on the CPU: packrt_run_device takes CUDA "
                                      "device pointers; use packrt_run");
}

void CpuExecutor::run_device(int, const std::vector<const void*>&, const std::vector<void*>&, void*,
                             std::vector<double>*) {
  check_device_run();
}

std::unique_ptr<Executor> open_cpu_executor(ExecutorSource& source) {
  uint64_t size = 0;
  AlignedBuffer image = source.package.read(source.target.kernels, &size);
  return std::make_unique<CpuExecutor>(source.plan, source.target.name, image, size,
                                       source.package.root() + "/" + source.target.kernels, std::move(source.weights),
                                       source.options.num_threads);
}

}  // namespace packrt
