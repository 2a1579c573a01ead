// The C API: thin wrappers that turn exceptions into status codes + a per-thread message.
#include <packrt/packrt.h>

#include <cstring>
#include <new>
#include <string>

#include "error.h"
#include "model.h"
#include "plan.h"

#ifndef PACKRT_VERSION
#define PACKRT_VERSION "0.0.0"
#endif

struct packrt_model {
  packrt::Model impl;
  packrt_model(const char* dir, const packrt_options& o) : impl(dir, o) {}
};

namespace {

thread_local std::string g_last_error;

// Errors are one line (kernel messages carry TVM's multi-line tracebacks): line breaks become " | ".
std::string one_line(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\n' || c == '\r') {
      while (i + 1 < text.size() && (text[i + 1] == '\n' || text[i + 1] == '\r' || text[i + 1] == ' ')) ++i;
      if (i + 1 < text.size() && !out.empty()) out += " | ";
    } else {
      out += c;
    }
  }
  return out;
}

template <typename F>
packrt_status guarded(F&& f) {
  try {
    f();
    g_last_error.clear();
    return PACKRT_OK;
  } catch (const packrt::Failure& e) {
    g_last_error = one_line(e.what());
    return e.status;
  } catch (const std::bad_alloc&) {
    g_last_error = "out of memory";
    return PACKRT_ERROR_RUNTIME;
  } catch (const std::exception& e) {
    g_last_error = one_line(std::string("internal error: ") + e.what());
    return PACKRT_ERROR_RUNTIME;
  }
}

packrt_status describe(const packrt_model* m, int32_t profile, int32_t index, packrt_tensor* info, bool input) {
  return guarded([&] {
    if (!m || !info) packrt::fail(PACKRT_ERROR_INVALID_ARGUMENT, "model and info must not be NULL");
    const auto& plan = m->impl.plan();
    if (profile < 0 || profile >= static_cast<int32_t>(plan.profiles.size()))
      packrt::fail(PACKRT_ERROR_INVALID_ARGUMENT, "profile index " + std::to_string(profile) + " out of range");
    const auto& prof = plan.profiles[profile];
    const auto& ios = input ? prof.inputs : prof.outputs;
    if (index < 0 || index >= static_cast<int32_t>(ios.size()))
      packrt::fail(PACKRT_ERROR_INVALID_ARGUMENT, std::string(input ? "input" : "output") + " index " +
                                                      std::to_string(index) + " out of range");
    const auto& t = prof.tensors[ios[index].tensor];
    std::memset(info, 0, sizeof *info);
    info->name = ios[index].name.c_str();
    info->dtype = t.dtype;
    info->ndim = static_cast<int32_t>(t.shape.size());
    for (size_t i = 0; i < t.shape.size(); ++i) info->shape[i] = t.shape[i];
    info->nbytes = t.nbytes;
  });
}

}  // namespace

extern "C" {

const char* packrt_version(void) { return PACKRT_VERSION; }

void packrt_options_init(packrt_options* o) {
  if (!o) return;
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->verify_checksums = 1;
}

packrt_status packrt_open(const char* dir, const packrt_options* options, packrt_model** model) {
  if (model) *model = nullptr;
  return guarded([&] {
    if (!dir || !model) packrt::fail(PACKRT_ERROR_INVALID_ARGUMENT, "package_dir and model must not be NULL");
    packrt_options o;
    packrt_options_init(&o);
    if (options) {
      if (options->struct_size < sizeof(uint32_t) || options->struct_size > sizeof o)
        packrt::fail(PACKRT_ERROR_INVALID_ARGUMENT, "packrt_options.struct_size is wrong: call packrt_options_init first");
      std::memcpy(&o, options, options->struct_size);
    }
    *model = new packrt_model(dir, o);
  });
}

void packrt_close(packrt_model* model) { delete model; }

const char* packrt_last_error(void) { return g_last_error.c_str(); }

const char* packrt_model_name(const packrt_model* m) { return m ? m->impl.name().c_str() : ""; }
const char* packrt_model_id(const packrt_model* m) { return m ? m->impl.id().c_str() : ""; }
const char* packrt_manifest_sha256(const packrt_model* m) { return m ? m->impl.manifest_sha256().c_str() : ""; }
const char* packrt_model_target(const packrt_model* m) { return m ? m->impl.target().c_str() : ""; }
const char* packrt_model_device(const packrt_model* m) { return m ? m->impl.device() : ""; }
int32_t packrt_num_threads(const packrt_model* m) { return m ? m->impl.num_threads() : 0; }
int32_t packrt_num_profiles(const packrt_model* m) {
  return m ? static_cast<int32_t>(m->impl.plan().profiles.size()) : 0;
}
const char* packrt_profile_name(const packrt_model* m, int32_t p) {
  if (!m || p < 0 || p >= packrt_num_profiles(m)) return "";
  return m->impl.plan().profiles[p].name.c_str();
}
int32_t packrt_num_inputs(const packrt_model* m) {
  return m ? static_cast<int32_t>(m->impl.plan().profiles[0].inputs.size()) : 0;
}
int32_t packrt_num_outputs(const packrt_model* m) {
  return m ? static_cast<int32_t>(m->impl.plan().profiles[0].outputs.size()) : 0;
}

packrt_status packrt_input_info(const packrt_model* m, int32_t profile, int32_t index, packrt_tensor* info) {
  return describe(m, profile, index, info, true);
}
packrt_status packrt_output_info(const packrt_model* m, int32_t profile, int32_t index, packrt_tensor* info) {
  return describe(m, profile, index, info, false);
}

packrt_status packrt_select_profile(const packrt_model* m, const packrt_tensor* inputs, int32_t num_inputs,
                                    int32_t* profile) {
  return guarded([&] {
    if (!m || !profile) packrt::fail(PACKRT_ERROR_INVALID_ARGUMENT, "model and profile must not be NULL");
    *profile = m->impl.select_profile(inputs, num_inputs);
  });
}

packrt_status packrt_run(packrt_model* m, const packrt_tensor* inputs, int32_t num_inputs, packrt_tensor* outputs,
                         int32_t num_outputs) {
  return guarded([&] {
    if (!m) packrt::fail(PACKRT_ERROR_INVALID_ARGUMENT, "model must not be NULL");
    m->impl.run(inputs, num_inputs, outputs, num_outputs);
  });
}

packrt_status packrt_run_device(packrt_model* m, const packrt_tensor* inputs, int32_t num_inputs,
                                packrt_tensor* outputs, int32_t num_outputs, void* cuda_stream) {
  return guarded([&] {
    if (!m) packrt::fail(PACKRT_ERROR_INVALID_ARGUMENT, "model must not be NULL");
    m->impl.run_device(inputs, num_inputs, outputs, num_outputs, cuda_stream);
  });
}

packrt_status packrt_set_profiling(packrt_model* m, int32_t enabled) {
  return guarded([&] {
    if (!m) packrt::fail(PACKRT_ERROR_INVALID_ARGUMENT, "model must not be NULL");
    m->impl.set_profiling(enabled != 0);
  });
}

int32_t packrt_num_steps(const packrt_model* m, int32_t profile) {
  if (!m || profile < 0 || profile >= packrt_num_profiles(m)) return 0;
  return static_cast<int32_t>(m->impl.plan().profiles[profile].steps.size());
}

packrt_status packrt_step_profile(const packrt_model* m, int32_t profile, int32_t step, const char** kernel,
                                  double* total_ms, int64_t* runs) {
  return guarded([&] {
    if (!m) packrt::fail(PACKRT_ERROR_INVALID_ARGUMENT, "model must not be NULL");
    if (step < 0 || step >= packrt_num_steps(m, profile))
      packrt::fail(PACKRT_ERROR_INVALID_ARGUMENT, "step index out of range");
    const auto& plan = m->impl.plan();
    const auto& st = plan.profiles[profile].steps[step];
    auto t = m->impl.step_time(profile, step);
    if (kernel)
      *kernel = st.kind == packrt::PlanStep::kCopy       ? "copy"
                : st.kind == packrt::PlanStep::kAssemble ? "assemble"
                                                         : plan.kernels[st.kernel].name.c_str();
    if (total_ms) *total_ms = t.total_ms;
    if (runs) *runs = t.runs;
  });
}

const char* packrt_dtype_name(int32_t dtype) { return packrt::dtype_name(dtype); }
size_t packrt_dtype_size(int32_t dtype) { return packrt::dtype_size(dtype); }

}  // extern "C"
