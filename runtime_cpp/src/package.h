// A package folder on disk: manifest.json, the files it lists (size + sha256), and its targets.
// Every path read from the manifest is confined to the package folder.
#pragma once
#include <packrt/packrt.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "buffer.h"

namespace packrt {

struct TargetEntry {
  std::string name, kind, arch, isa;
  std::vector<std::string> cpu_features;
  std::string plan, kernels, weights;  // paths relative to the package root
  int sm = 0;                          // CUDA targets: compute capability (e.g. 80)
};

struct FileEntry {
  std::string sha256;
  uint64_t bytes = 0;
};

class Package {
 public:
  // Opens dir/manifest.json. `verify`: read() checks every file's sha256 (else only its size);
  // `expected_sha256`, when given, is the hash the manifest must have (64 hex digits: anything
  // else, the empty string included, is refused), and implies verify.
  explicit Package(const std::string& dir, bool verify = true,
                   const std::optional<std::string>& expected_sha256 = std::nullopt);

  const std::string& root() const { return root_; }
  const std::string& name() const { return name_; }
  const std::string& id() const { return id_; }
  const std::string& manifest_sha256() const { return manifest_sha256_; }
  const std::vector<TargetEntry>& targets() const { return targets_; }

  // The target to run: `wanted` by name, or the first one (of `type`) that runs on this machine:
  // CPU targets need this CPU's architecture and features, CUDA targets a driver, this host
  // architecture and a GPU (`cuda_device`) of at least their compute capability. Throws with the
  // reason each target was rejected.
  const TargetEntry& select_target(const std::string& wanted, packrt_device_type type = PACKRT_DEVICE_ANY,
                                   int cuda_device = 0) const;

  // Reads a listed file into an aligned buffer, checking its size and (if verifying) its sha256: the
  // file is opened once inside the package (no symlinks, regular files only) and the bytes that
  // were hashed are the bytes returned, so nothing can be swapped in between. The buffer is a page
  // mapping of its own (make_read_only can seal it).
  AlignedBuffer read(const std::string& rel, uint64_t* size = nullptr) const;

 private:
  void check_rel(const std::string& rel) const;   // a listed path that stays inside the package
  const FileEntry& entry(const std::string& rel) const;
  std::string root_, name_, id_, manifest_sha256_;
  bool verify_ = true;
  std::vector<TargetEntry> targets_;
  std::map<std::string, FileEntry> files_;
};

}  // namespace packrt
