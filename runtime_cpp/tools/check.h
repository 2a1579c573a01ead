// packrt-run --check: a package checks itself against the reference data stored in it at build
// time (reference/reference.json: seeded inputs and onnxruntime's outputs per profile), on the
// machine it runs on, with no Python. One line per target and profile; see check.cpp.
#pragma once
#include <optional>
#include <string>

namespace packrt_cli {

struct CheckOptions {
  std::string package, target;
  std::optional<std::string> expect_sha256;  // pin the manifest (see packrt_options.expected_sha256)
  bool all_targets = false;  // every target that can run here (default: the one packrt_open picks)
  bool verify = true;        // sha256 of package files
  int threads = 0, cuda_device = 0;
};

// Returns the exit code: 0 every checked target/profile within tolerance, 1 a mismatch (or a
// failed run), 2 nothing could be checked (no reference data, no target runs here).
int run_check(const CheckOptions& opt);

}  // namespace packrt_cli
