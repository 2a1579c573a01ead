// RegisterCustomOps, the library's only export: adds the "ai.packager" domain with the
// PackagedModel op for the CPU EP and for the CUDA EP (see op.h) to a session's options.
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "op.h"

#define PACKAGER_EXPORT extern "C" __attribute__((visibility("default")))

namespace packager_ort {
namespace {

// Ops and domains must outlive every session that uses them: keep them for the process lifetime.
std::mutex g_mu;
std::vector<std::unique_ptr<PackagedModelOp>> g_ops;
std::vector<Ort::CustomOpDomain> g_domains;

std::string config_entry(const OrtApi* api, const OrtSessionOptions* options, const char* key) {
  int has = 0;
  if (OrtStatus* st = api->HasSessionConfigEntry(options, key, &has)) {
    api->ReleaseStatus(st);
    return "";
  }
  if (!has) return "";
  size_t size = 0;
  if (OrtStatus* st = api->GetSessionConfigEntry(options, key, nullptr, &size)) api->ReleaseStatus(st);
  std::string value(size, '\0');
  if (OrtStatus* st = api->GetSessionConfigEntry(options, key, &value[0], &size)) {
    api->ReleaseStatus(st);
    return "";
  }
  value.resize(size ? size - 1 : 0);  // size counts the terminating NUL
  return value;
}

}  // namespace
}  // namespace packager_ort

PACKAGER_EXPORT OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  using namespace packager_ort;
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (!api) {  // onnxruntime older than the headers we were built with: report through API v1
    std::string msg = std::string("packager custom ops need ONNX Runtime API ") + std::to_string(ORT_API_VERSION) +
                      " (onnxruntime 1." + std::to_string(ORT_API_VERSION) + "+); this is " + api_base->GetVersionString();
    return api_base->GetApi(1)->CreateStatus(ORT_FAIL, msg.c_str());
  }
  Ort::InitApi(api);
  try {
    Settings s;
    s.model_dir = config_entry(api, options, kModelDirKey);
    std::string threads = config_entry(api, options, kThreadsKey);
    if (!threads.empty()) {   // a whole number 0..PACKRT_MAX_THREADS (atoi takes "12abc" and wraps huge values)
      char* end = nullptr;
      long n = std::strtol(threads.c_str(), &end, 10);
      if (end == threads.c_str() || *end != '\0' || n < 0 || n > PACKRT_MAX_THREADS)
        return api->CreateStatus(ORT_INVALID_ARGUMENT, (std::string("session config entry ") + kThreadsKey +
                                                        " must be a number from 0 (one per core) to " +
                                                        std::to_string(PACKRT_MAX_THREADS) + ", got '" +
                                                        threads + "'").c_str());
      s.num_threads = static_cast<int>(n);
    }
    std::lock_guard<std::mutex> lock(g_mu);
    Ort::CustomOpDomain domain{kDomain};
    for (bool on_cuda : {false, true}) {
      g_ops.push_back(std::make_unique<PackagedModelOp>(s, on_cuda));
      domain.Add(g_ops.back().get());
    }
    Ort::UnownedSessionOptions(options).Add(domain);
    g_domains.push_back(std::move(domain));
    return nullptr;
  } catch (const std::exception& e) {
    return Ort::Status(e).release();
  }
}
