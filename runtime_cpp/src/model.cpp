#include "model.h"

#include <algorithm>

#include "error.h"
#include "package.h"

namespace packrt {
namespace {

std::string shape_str(const int64_t* shape, size_t ndim) {
  std::string o = "[";
  for (size_t i = 0; i < ndim; ++i) o += (i ? "," : "") + std::to_string(shape[i]);
  return o + "]";
}

std::string shape_str(const std::vector<int64_t>& s) { return shape_str(s.data(), s.size()); }

}  // namespace

Model::Model(const std::string& package_dir, const packrt_options& options) {
  Package pkg(package_dir, options.verify_checksums != 0,
              options.expected_sha256 ? std::optional<std::string>(options.expected_sha256) : std::nullopt);
  if (options.device_type != PACKRT_DEVICE_ANY && options.device_type != PACKRT_DEVICE_CPU &&
      options.device_type != PACKRT_DEVICE_CUDA)
    fail(PACKRT_ERROR_INVALID_ARGUMENT, "device_type must be 0 (any), 1 (CPU) or 2 (CUDA)");
  const TargetEntry& t = pkg.select_target(options.target ? options.target : "",
                                           static_cast<packrt_device_type>(options.device_type), options.cuda_device);
  name_ = pkg.name();
  id_ = pkg.id();
  manifest_sha256_ = pkg.manifest_sha256();
  target_ = t.name;

  uint64_t plan_size = 0;
  AlignedBuffer plan_text = pkg.read(t.plan, &plan_size);
  plan_ = parse_plan(reinterpret_cast<const char*>(plan_text.get()), plan_size, pkg.root() + "/" + t.plan);

  uint64_t weights_size = 0;
  AlignedBuffer weights = pkg.read(t.weights, &weights_size);
  if (weights_size != plan_.weights_bytes)
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, t.weights + " has " + std::to_string(weights_size) + " bytes, the plan expects " +
                                           std::to_string(plan_.weights_bytes));
  if (!make_read_only(weights))   // shared by every run: a kernel that writes them faults instead
    fail(PACKRT_ERROR_RUNTIME, "cannot make the weights of target '" + t.name + "' read-only");

  if (options.num_threads < 0 || options.num_threads > PACKRT_MAX_THREADS)
    fail(PACKRT_ERROR_INVALID_ARGUMENT, "num_threads " + std::to_string(options.num_threads) + " is outside 0 (one per core) to " +
                                            std::to_string(PACKRT_MAX_THREADS));
  executor_ = open_executor({pkg, t, plan_, std::move(weights), options});
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
  std::string msg = "input shapes";
  for (size_t k = 0; k < first.inputs.size(); ++k) {
    const packrt_tensor& in = inputs[order[k]];
    msg += " " + first.inputs[k].name + shape_str(in.shape, in.ndim);
  }
  msg += " match no profile of model '" + name_ + "'; it was built for:";
  for (const auto& prof : plan_.profiles) {
    msg += " " + prof.name + " (";
    for (size_t k = 0; k < prof.inputs.size(); ++k)
      msg += (k ? " " : "") + prof.inputs[k].name + shape_str(prof.tensors[prof.inputs[k].tensor].shape);
    msg += ")";
  }
  fail(PACKRT_ERROR_INVALID_ARGUMENT, msg);
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
  for (size_t k = 0; k < prof.inputs.size(); ++k) b.inputs.push_back(inputs[b.in_order[k]].data);
  for (size_t k = 0; k < prof.outputs.size(); ++k) b.outputs.push_back(outputs[b.out_order[k]].data);
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

template <typename Run>
void Model::timed(int profile, Run&& run) {
  if (!profiling_.load(std::memory_order_relaxed)) return run(nullptr);
  std::vector<double> ms(plan_.profiles[profile].steps.size());
  run(&ms);
  record_times(profile, ms);
}

void Model::run(const packrt_tensor* inputs, int num_inputs, packrt_tensor* outputs, int num_outputs) {
  Binding b = bind(inputs, num_inputs, outputs, num_outputs);
  timed(b.profile, [&](std::vector<double>* ms) { executor_->run_host(b.profile, b.inputs, b.outputs, ms); });
  fill_output_info(b, outputs);
}

void Model::run_device(const packrt_tensor* inputs, int num_inputs, packrt_tensor* outputs, int num_outputs,
                       void* stream) {
  executor_->check_device_run();
  Binding b = bind(inputs, num_inputs, outputs, num_outputs);
  timed(b.profile, [&](std::vector<double>* ms) { executor_->run_device(b.profile, b.inputs, b.outputs, stream, ms); });
  fill_output_info(b, outputs);
}

}  // namespace packrt
