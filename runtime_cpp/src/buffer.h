// 64-byte aligned heap buffers: TVM's generated kernels assume 64-byte aligned data.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace packrt {

constexpr size_t kAlign = 64;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t[], FreeDeleter>;

inline AlignedBuffer aligned_buffer(size_t nbytes) {
  if (nbytes > SIZE_MAX - kAlign) throw std::bad_alloc();   // the round-up below would wrap
  size_t n = (nbytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, n ? n : kAlign);
  if (!p) throw std::bad_alloc();
  return AlignedBuffer(static_cast<uint8_t*>(p));
}

inline bool is_aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) % kAlign) == 0; }

}  // namespace packrt
