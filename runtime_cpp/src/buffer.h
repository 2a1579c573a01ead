// 64-byte aligned buffers: TVM's generated kernels assume 64-byte aligned data. Heap buffers
// (arenas) or page mappings (package files), which can be made read-only once filled, so a kernel
// or step that writes into the weights faults instead of corrupting them for every later run.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace packrt {

constexpr size_t kAlign = 64;

struct BufferDeleter {
  size_t mapped = 0;  // 0: from aligned_alloc; else the length of the page mapping
  void operator()(void* p) const {
    if (mapped)
      ::munmap(p, mapped);
    else
      std::free(p);
  }
};
using AlignedBuffer = std::unique_ptr<uint8_t[], BufferDeleter>;

inline AlignedBuffer aligned_buffer(size_t nbytes) {
  if (nbytes > SIZE_MAX - kAlign) throw std::bad_alloc();   // the round-up below would wrap
  size_t n = (nbytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, n ? n : kAlign);
  if (!p) throw std::bad_alloc();
  return AlignedBuffer(static_cast<uint8_t*>(p));
}

// Zero-filled pages of their own (at least one), so they can be sealed with make_read_only.
inline AlignedBuffer mapped_buffer(size_t nbytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (nbytes > SIZE_MAX - page) throw std::bad_alloc();
  size_t n = nbytes ? (nbytes + page - 1) / page * page : page;
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return AlignedBuffer(static_cast<uint8_t*>(p), BufferDeleter{n});
}

// Makes a mapped_buffer read-only; false if the system refused (or it is not a mapping).
inline bool make_read_only(const AlignedBuffer& b) {
  return b && b.get_deleter().mapped && ::mprotect(b.get(), b.get_deleter().mapped, PROT_READ) == 0;
}

inline bool is_aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) % kAlign) == 0; }

}  // namespace packrt
