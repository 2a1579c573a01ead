#include "model.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "cpu_features.h"
#include "error.h"

namespace packrt {
namespace {

std::string shape_str(const int64_t* shape, size_t ndim) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < ndim; ++i) o << (i ? "," : "") << shape[i];
  o << "]";
  return o.str();
}

std::string shape_str(const std::vector<int64_t>& s) { return shape_str(s.data(), s.size()); }

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
    case PACKRT_BOOL: return {kDLBool, 8, 1};
    default: return {kDLFloat, 32, 1};
  }
}

alignas(64) uint8_t g_empty[64];  // data pointer for zero-byte tensors (kernels reject NULL)

}  // namespace

Model::Model(const std::string& package_dir, const packrt_options& options) {
  Package pkg(package_dir);
  if (options.device_type < 0 || options.device_type > 2)
    fail(PACKRT_ERROR_INVALID_ARGUMENT, "device_type must be 0 (any), 1 (CPU) or 2 (CUDA)");
  const TargetEntry& t = pkg.select_target(options.target ? options.target : "",
                                           static_cast<DeviceType>(options.device_type), options.cuda_device);
  bool verify = options.verify_checksums != 0;
  name_ = pkg.name();
  id_ = pkg.id();
  target_ = t.name;

  uint64_t plan_size = 0;
  AlignedBuffer plan_text = pkg.read(t.plan, verify, &plan_size);
  plan_ = parse_plan(reinterpret_cast<const char*>(plan_text.get()), plan_size, pkg.root() + "/" + t.plan);

  uint64_t weights_size = 0;
  weights_ = pkg.read(t.weights, verify, &weights_size);
  if (weights_size != plan_.weights_bytes)
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, t.weights + " has " + std::to_string(weights_size) + " bytes, the plan expects " +
                                           std::to_string(plan_.weights_bytes));

  if (options.num_threads < 0) fail(PACKRT_ERROR_INVALID_ARGUMENT, "num_threads must be >= 0");
  if ((t.kind == "cuda") != (plan_.device == "cuda"))
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, t.plan + " is a " + plan_.device + " plan for a " + t.kind + " target");
  if (t.kind == "cuda") {
    AlignedBuffer image = pkg.read(t.kernels, verify);
    cuda_ = std::make_unique<CudaExecutor>(plan_, image.get(), weights_.get(), weights_size, options.cuda_device,
                                           options.cuda_graph != 0);
    weights_.reset();  // uploaded to the GPU
    pool_ = std::make_unique<ThreadPool>(1);
  } else {
    pkg.check(t.kernels, verify);
    kernels_ = std::make_unique<KernelLibrary>(pkg.path_of(t.kernels));
    for (const auto& k : plan_.kernels) fns_.push_back(kernels_->kernel(k.symbol));
    pool_ = std::make_unique<ThreadPool>(options.num_threads > 0 ? options.num_threads : host_cores());
  }
  free_contexts_.resize(plan_.profiles.size());
  for (const auto& prof : plan_.profiles) step_times_.emplace_back(prof.steps.size());
}

void Model::set_profiling(bool on) {
  std::lock_guard<std::mutex> l(profile_mu_);
  for (auto& steps : step_times_) std::fill(steps.begin(), steps.end(), StepTime{});
  profiling_ = on;
}

Model::StepTime Model::step_time(int profile, int step) const {
  std::lock_guard<std::mutex> l(profile_mu_);
  return step_times_.at(profile).at(step);
}

std::vector<int> Model::bind_order(const packrt_tensor* ts, int n, const std::vector<PlanIO>& ios,
                                   const char* what) const {
  std::string expected;
  for (const auto& io : ios) expected += (expected.empty() ? "" : ", ") + io.name;
  if (n != static_cast<int>(ios.size()))
    fail(PACKRT_ERROR_INVALID_ARGUMENT, "model '" + name_ + "' takes " + std::to_string(ios.size()) + " " + what +
                                            "s (" + expected + "), got " + std::to_string(n));
  if (n > 0 && !ts) fail(PACKRT_ERROR_INVALID_ARGUMENT, std::string(what) + " array is NULL");
  std::vector<int> order(ios.size(), -1);
  for (int i = 0; i < n; ++i) {
    int slot = i;
    if (ts[i].name) {
      slot = -1;
      for (size_t k = 0; k < ios.size(); ++k)
        if (ios[k].name == ts[i].name) slot = static_cast<int>(k);
      if (slot < 0)
        fail(PACKRT_ERROR_INVALID_ARGUMENT, std::string("model '") + name_ + "' has no " + what + " named '" +
                                                ts[i].name + "' (its " + what + "s: " + expected + ")");
    }
    if (order[slot] >= 0)
      fail(PACKRT_ERROR_INVALID_ARGUMENT, std::string(what) + " '" + ios[slot].name + "' is given twice");
    order[slot] = i;
  }
  return order;
}

int Model::match_profile(const packrt_tensor* inputs, const std::vector<int>& order) const {
  const auto& first = plan_.profiles[0];
  for (size_t k = 0; k < first.inputs.size(); ++k) {
    const packrt_tensor& in = inputs[order[k]];
    int32_t want = first.tensors[first.inputs[k].tensor].dtype;
    if (in.dtype != want)
      fail(PACKRT_ERROR_INVALID_ARGUMENT, "input '" + first.inputs[k].name + "' has dtype " + dtype_name(in.dtype) +
                                              ", the model expects " + dtype_name(want));
    if (in.ndim < 0 || in.ndim > PACKRT_MAX_DIMS)
      fail(PACKRT_ERROR_INVALID_ARGUMENT, "input '" + first.inputs[k].name + "' has invalid rank " + std::to_string(in.ndim));
  }
  for (size_t p = 0; p < plan_.profiles.size(); ++p) {
    const auto& prof = plan_.profiles[p];
    bool ok = true;
    for (size_t k = 0; k < prof.inputs.size() && ok; ++k) {
      const packrt_tensor& in = inputs[order[k]];
      const auto& shape = prof.tensors[prof.inputs[k].tensor].shape;
      ok = static_cast<size_t>(in.ndim) == shape.size() && std::equal(shape.begin(), shape.end(), in.shape);
    }
    if (ok) return static_cast<int>(p);
  }
  std::ostringstream msg;
  msg << "input shapes";
  for (size_t k = 0; k < first.inputs.size(); ++k) {
    const packrt_tensor& in = inputs[order[k]];
    msg << " " << first.inputs[k].name << shape_str(in.shape, in.ndim);
  }
  msg << " match no profile of model '" << name_ << "'; it was built for:";
  for (const auto& prof : plan_.profiles) {
    msg << " " << prof.name << " (";
    for (size_t k = 0; k < prof.inputs.size(); ++k)
      msg << (k ? " " : "") << prof.inputs[k].name << shape_str(prof.tensors[prof.inputs[k].tensor].shape);
    msg << ")";
  }
  fail(PACKRT_ERROR_INVALID_ARGUMENT, msg.str());
}

std::unique_ptr<Model::Context> Model::acquire(int profile) {
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
  ctx->arena = aligned_buffer(prof.arena_bytes);
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

void Model::release(std::unique_ptr<Context> ctx) {
  std::lock_guard<std::mutex> l(contexts_mu_);
  free_contexts_[ctx->profile].push_back(std::move(ctx));
}

void Model::execute(Context& ctx) {
  const PlanProfile& prof = plan_.profiles[ctx.profile];
  PoolScope scope(pool_.get());
  const bool timed = profiling_.load(std::memory_order_relaxed);
  std::vector<double> ms(timed ? prof.steps.size() : 0);
  for (size_t s = 0; s < prof.steps.size(); ++s) {
    const PlanStep& step = prof.steps[s];
    auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    if (step.kind == PlanStep::kCopy) {
      const PlanTensor& src = prof.tensors[step.args[0]];
      std::memcpy(ctx.tensors[step.args[1]].data, ctx.tensors[step.args[0]].data, src.nbytes);
    } else {
      TVMFFIAny result;
      std::memset(&result, 0, sizeof result);
      auto& args = ctx.args[s];
      if (fns_[step.kernel](nullptr, args.data(), static_cast<int32_t>(args.size()), &result) != 0)
        fail(PACKRT_ERROR_RUNTIME, "kernel '" + plan_.kernels[step.kernel].name + "' (step " + std::to_string(s) +
                                       ") failed: " + kernels_->last_error());
    }
    if (timed) ms[s] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  if (timed) record_times(ctx.profile, ms);
}

void Model::record_times(int profile, const std::vector<double>& ms) {
  std::lock_guard<std::mutex> l(profile_mu_);
  auto& acc = step_times_[profile];
  for (size_t s = 0; s < ms.size(); ++s) {
    acc[s].total_ms += ms[s];
    acc[s].runs += 1;
  }
}

int Model::select_profile(const packrt_tensor* inputs, int num_inputs) const {
  return match_profile(inputs, bind_order(inputs, num_inputs, plan_.profiles[0].inputs, "input"));
}

Model::Binding Model::bind(const packrt_tensor* inputs, int num_inputs, packrt_tensor* outputs,
                           int num_outputs) const {
  const auto& first = plan_.profiles[0];
  Binding b;
  b.in_order = bind_order(inputs, num_inputs, first.inputs, "input");
  b.out_order = bind_order(outputs, num_outputs, first.outputs, "output");
  b.profile = match_profile(inputs, b.in_order);
  const PlanProfile& prof = plan_.profiles[b.profile];

  for (size_t k = 0; k < prof.inputs.size(); ++k) {
    const packrt_tensor& in = inputs[b.in_order[k]];
    const PlanTensor& t = prof.tensors[prof.inputs[k].tensor];
    if (in.nbytes < t.nbytes || (t.nbytes && !in.data))
      fail(PACKRT_ERROR_INVALID_ARGUMENT, "input '" + prof.inputs[k].name + "' buffer holds " + std::to_string(in.nbytes) +
                                              " bytes, needs " + std::to_string(t.nbytes));
  }
  for (size_t k = 0; k < prof.outputs.size(); ++k) {
    const packrt_tensor& out = outputs[b.out_order[k]];
    const PlanTensor& t = prof.tensors[prof.outputs[k].tensor];
    if (out.dtype != PACKRT_DTYPE_UNKNOWN && out.dtype != t.dtype)
      fail(PACKRT_ERROR_INVALID_ARGUMENT, "output '" + prof.outputs[k].name + "' is " + dtype_name(t.dtype) +
                                              ", the caller's buffer is declared " + dtype_name(out.dtype));
    if (out.nbytes < t.nbytes || (t.nbytes && !out.data))
      fail(PACKRT_ERROR_INVALID_ARGUMENT, "output '" + prof.outputs[k].name + "' needs " + std::to_string(t.nbytes) +
                                              " bytes " + shape_str(t.shape) + ", the caller's buffer holds " +
                                              std::to_string(out.nbytes));
  }
  return b;
}

void Model::fill_output_info(const Binding& b, packrt_tensor* outputs) const {
  const PlanProfile& prof = plan_.profiles[b.profile];
  for (size_t k = 0; k < prof.outputs.size(); ++k) {
    packrt_tensor& out = outputs[b.out_order[k]];
    const PlanTensor& t = prof.tensors[prof.outputs[k].tensor];
    out.dtype = t.dtype;
    out.ndim = static_cast<int32_t>(t.shape.size());
    std::copy(t.shape.begin(), t.shape.end(), out.shape);
  }
}

void Model::run_device(const packrt_tensor* inputs, int num_inputs, packrt_tensor* outputs, int num_outputs,
                       void* stream) {
  if (!cuda_)
    fail(PACKRT_ERROR_INVALID_ARGUMENT, "target '" + target_ + "' runs on the CPU: packrt_run_device takes CUDA "
                                        "device pointers; use packrt_run");
  Binding b = bind(inputs, num_inputs, outputs, num_outputs);
  const PlanProfile& prof = plan_.profiles[b.profile];
  std::vector<CUdeviceptr> ins, outs;
  for (size_t k = 0; k < prof.inputs.size(); ++k)
    ins.push_back(reinterpret_cast<CUdeviceptr>(inputs[b.in_order[k]].data));
  for (size_t k = 0; k < prof.outputs.size(); ++k)
    outs.push_back(reinterpret_cast<CUdeviceptr>(outputs[b.out_order[k]].data));
  const bool timed = profiling_.load(std::memory_order_relaxed);
  std::vector<double> ms(timed ? prof.steps.size() : 0);
  cuda_->run_device(b.profile, ins, outs, static_cast<CUstream>(stream), timed ? &ms : nullptr);
  if (timed) record_times(b.profile, ms);
  fill_output_info(b, outputs);
}

void Model::run(const packrt_tensor* inputs, int num_inputs, packrt_tensor* outputs, int num_outputs) {
  Binding b = bind(inputs, num_inputs, outputs, num_outputs);
  const int p = b.profile;
  const PlanProfile& prof = plan_.profiles[p];
  const std::vector<int>& in_order = b.in_order;
  const std::vector<int>& out_order = b.out_order;
  if (cuda_) {
    std::vector<const void*> ins;
    std::vector<void*> outs;
    for (size_t k = 0; k < prof.inputs.size(); ++k) ins.push_back(inputs[in_order[k]].data);
    for (size_t k = 0; k < prof.outputs.size(); ++k) outs.push_back(outputs[out_order[k]].data);
    const bool timed = profiling_.load(std::memory_order_relaxed);
    std::vector<double> ms(timed ? prof.steps.size() : 0);
    cuda_->run_host(p, ins, outs, timed ? &ms : nullptr);
    if (timed) record_times(p, ms);
    fill_output_info(b, outputs);
    return;
  }

  std::unique_ptr<Context> ctx = acquire(p);
  struct Release {  // give the context back even if a kernel fails
    Model* m;
    std::unique_ptr<Context>& c;
    ~Release() { m->release(std::move(c)); }
  } release_guard{this, ctx};

  // Bind caller buffers: aligned ones are used in place, others are staged through the arena.
  std::vector<bool> out_direct(prof.outputs.size());
  for (size_t k = 0; k < prof.inputs.size(); ++k) {
    const packrt_tensor& in = inputs[in_order[k]];
    const PlanTensor& t = prof.tensors[prof.inputs[k].tensor];
    DLTensor& d = ctx->tensors[prof.inputs[k].tensor];
    if (!t.nbytes) continue;
    if (is_aligned(in.data)) {
      d.data = in.data;
    } else {
      d.data = ctx->arena.get() + t.offset;
      std::memcpy(d.data, in.data, t.nbytes);
    }
  }
  for (size_t k = 0; k < prof.outputs.size(); ++k) {
    const packrt_tensor& out = outputs[out_order[k]];
    const PlanTensor& t = prof.tensors[prof.outputs[k].tensor];
    DLTensor& d = ctx->tensors[prof.outputs[k].tensor];
    out_direct[k] = t.nbytes && is_aligned(out.data);
    if (t.nbytes) d.data = out_direct[k] ? out.data : ctx->arena.get() + t.offset;
  }

  execute(*ctx);

  for (size_t k = 0; k < prof.outputs.size(); ++k) {
    packrt_tensor& out = outputs[out_order[k]];
    const PlanTensor& t = prof.tensors[prof.outputs[k].tensor];
    if (t.nbytes && !out_direct[k]) std::memcpy(out.data, ctx->arena.get() + t.offset, t.nbytes);
  }
  fill_output_info(b, outputs);
}

}  // namespace packrt
