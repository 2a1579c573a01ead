// SHA-256 (FIPS 180-4), streaming. Hand-written on purpose: the runtime must build on a bare
// device toolchain with no crypto library; tests check it against Python's hashlib.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace packrt {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hex();  // finalizes; call once

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

}  // namespace packrt
