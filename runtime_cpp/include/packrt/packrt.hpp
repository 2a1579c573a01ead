// packrt.hpp: a thin C++ wrapper over the packrt C API (header-only, exceptions instead of codes).
#ifndef PACKRT_PACKRT_HPP_
#define PACKRT_PACKRT_HPP_

#include <packrt/packrt.h>

#include <cstdint>
#include <stdexcept>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace packrt {

class Error : public std::runtime_error {
 public:
  Error(packrt_status status, const std::string& what) : std::runtime_error(what), status_(status) {}
  packrt_status status() const { return status_; }

 private:
  packrt_status status_;
};

inline void check(packrt_status s) {
  if (s != PACKRT_OK) throw Error(s, packrt_last_error());
}

struct TensorInfo {
  std::string name;
  packrt_dtype dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes;
};

struct Options {
  std::string target;  // empty: first target that runs on this machine
  int num_threads = 0;  // 0: all cores
  bool verify_checksums = true;
  int32_t device_type = PACKRT_DEVICE_ANY;  // a packrt_device_type; with no target: any, CPU only or CUDA only
  int cuda_device = 0;  // CUDA device ordinal
  bool cuda_graph = false;  // replay each profile's kernels as a CUDA graph after its first run
  std::optional<std::string> expected_sha256;  // the sha256 manifest.json must have (pins one build)
};

class Model {
 public:
  explicit Model(const std::string& package_dir, const Options& opt = Options()) {
    packrt_options o;
    packrt_options_init(&o);
    o.target = opt.target.empty() ? nullptr : opt.target.c_str();
    o.num_threads = opt.num_threads;
    o.verify_checksums = opt.verify_checksums ? 1 : 0;
    o.device_type = opt.device_type;
    o.cuda_device = opt.cuda_device;
    o.cuda_graph = opt.cuda_graph ? 1 : 0;
    o.expected_sha256 = opt.expected_sha256 ? opt.expected_sha256->c_str() : nullptr;
    check(packrt_open(package_dir.c_str(), &o, &m_));
  }
  ~Model() { packrt_close(m_); }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  Model(Model&& other) noexcept : m_(std::exchange(other.m_, nullptr)) {}
  Model& operator=(Model&& other) noexcept {
    std::swap(m_, other.m_);
    return *this;
  }

  std::string name() const { return packrt_model_name(m_); }
  std::string manifest_sha256() const { return packrt_manifest_sha256(m_); }
  std::string target() const { return packrt_model_target(m_); }
  std::string device() const { return packrt_model_device(m_); }
  int num_threads() const { return packrt_num_threads(m_); }
  int num_profiles() const { return packrt_num_profiles(m_); }
  std::string profile_name(int p) const { return packrt_profile_name(m_, p); }
  std::vector<TensorInfo> inputs(int profile = 0) const { return infos(profile, true); }
  std::vector<TensorInfo> outputs(int profile = 0) const { return infos(profile, false); }

  // Runs on caller buffers; output shapes are written back into `outputs`.
  void run(const std::vector<packrt_tensor>& inputs, std::vector<packrt_tensor>& outputs) {
    check(packrt_run(m_, inputs.data(), static_cast<int32_t>(inputs.size()), outputs.data(),
                     static_cast<int32_t>(outputs.size())));
  }

  packrt_model* get() const { return m_; }

 private:
  std::vector<TensorInfo> infos(int profile, bool in) const {
    std::vector<TensorInfo> out;
    int n = in ? packrt_num_inputs(m_) : packrt_num_outputs(m_);
    for (int i = 0; i < n; ++i) {
      packrt_tensor t;
      check(in ? packrt_input_info(m_, profile, i, &t) : packrt_output_info(m_, profile, i, &t));
      out.push_back({t.name, static_cast<packrt_dtype>(t.dtype), std::vector<int64_t>(t.shape, t.shape + t.ndim),
                     t.nbytes});
    }
    return out;
  }
  packrt_model* m_ = nullptr;
};

// A packrt_tensor describing `data` (shape from `info`), for run() inputs and outputs.
inline packrt_tensor make_tensor(const TensorInfo& info, void* data, uint64_t nbytes) {
  packrt_tensor t{};
  t.name = info.name.c_str();
  t.data = data;
  t.dtype = info.dtype;
  t.ndim = static_cast<int32_t>(info.shape.size());
  for (size_t i = 0; i < info.shape.size() && i < PACKRT_MAX_DIMS; ++i) t.shape[i] = info.shape[i];
  t.nbytes = nbytes;
  return t;
}

}  // namespace packrt

#endif  // PACKRT_PACKRT_HPP_
