#include "cpu/kernel_library.h"

#include <dlfcn.h>
#include <packrt/kernel_abi.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "buffer.h"
#include "error.h"

namespace packrt {
namespace {

thread_local ThreadPool* tls_pool = nullptr;

int parallel_launch(ParallelLambda fn, void* cdata, int num_task) {
  if (tls_pool) return tls_pool->launch(fn, cdata, num_task);
  ParallelEnv env{nullptr, 1};
  return fn(0, &env, cdata) == 0 ? 0 : -1;
}

// Workspace for kernel intermediates (padding buffers, big local tiles). Kernels allocate and
// free in nested scopes, so each thread keeps a bump stack over reusable chunks: after the first
// run, allocation is a pointer increment. A free out of LIFO order is tolerated (the space is
// reclaimed once everything above it is freed).
struct WorkspaceStack {
  struct Chunk {
    AlignedBuffer mem;
    size_t size = 0, used = 0;
  };
  struct Live {
    void* ptr;
    size_t chunk, offset;
    bool freed;
  };
  std::vector<Chunk> chunks;
  std::vector<Live> live;
  size_t current = 0;

  void* alloc(size_t nbytes) {
    nbytes = (nbytes + kAlign - 1) / kAlign * kAlign;
    while (current < chunks.size() && chunks[current].size - chunks[current].used < nbytes) {
      if (chunks[current].used == 0) {  // an empty chunk that is too small: replace it
        chunks[current] = Chunk{aligned_buffer(nbytes), nbytes, 0};
        break;
      }
      ++current;
    }
    if (current == chunks.size()) {
      size_t size = std::max<size_t>(nbytes, size_t(1) << 20);
      chunks.push_back(Chunk{aligned_buffer(size), size, 0});
    }
    Chunk& c = chunks[current];
    void* p = c.mem.get() + c.used;
    live.push_back(Live{p, current, c.used, false});
    c.used += nbytes;
    return p;
  }

  void free(void* p) {
    for (auto it = live.rbegin(); it != live.rend(); ++it)
      if (it->ptr == p && !it->freed) {
        it->freed = true;
        break;
      }
    while (!live.empty() && live.back().freed) {
      chunks[live.back().chunk].used = live.back().offset;
      current = live.back().chunk;
      live.pop_back();
    }
  }
};

thread_local WorkspaceStack tls_workspace;

void* alloc_workspace(int /*device_type*/, int /*device_id*/, uint64_t nbytes, int /*dtype_code*/, int /*dtype_bits*/) {
  try {
    return tls_workspace.alloc(static_cast<size_t>(nbytes));
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

int free_workspace(int /*device_type*/, int /*device_id*/, void* p) {
  tls_workspace.free(p);
  return 0;
}

template <typename T>
void set_hook(void* handle, const char* name, T value) {
  if (auto* slot = reinterpret_cast<T*>(dlsym(handle, name))) *slot = value;
}

}  // namespace

KernelLibrary::KernelLibrary(const std::string& path) : path_(path) {
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) fail(PACKRT_ERROR_CORRUPT_PACKAGE, std::string("cannot load kernels: ") + dlerror());
  auto abi = reinterpret_cast<int (*)()>(dlsym(handle_, "packrt_kernels_abi_version"));
  last_error_ = reinterpret_cast<const char* (*)()>(dlsym(handle_, "packrt_kernels_last_error"));
  if (!abi || !last_error_ || abi() != PACKRT_KERNEL_ABI_VERSION) {
    dlclose(handle_);
    fail(PACKRT_ERROR_UNSUPPORTED, path + ": kernel library ABI does not match this runtime");
  }
  // The kernels' own weak hook variables (bound locally: the library is linked -Bsymbolic).
  set_hook(handle_, "__TVMBackendAllocWorkspace", &alloc_workspace);
  set_hook(handle_, "__TVMBackendFreeWorkspace", &free_workspace);
  set_hook(handle_, "__TVMBackendParallelLaunch", &parallel_launch);
  set_hook<packrt_parallel_barrier_fn>(handle_, "packrt_parallel_barrier", &parallel_barrier);
}

KernelLibrary::~KernelLibrary() {
  if (handle_) dlclose(handle_);
}

PackedKernel KernelLibrary::kernel(const std::string& symbol) const {
  void* f = dlsym(handle_, symbol.c_str());
  if (!f) fail(PACKRT_ERROR_CORRUPT_PACKAGE, path_ + " has no kernel '" + symbol + "'");
  return reinterpret_cast<PackedKernel>(f);
}

std::string KernelLibrary::last_error() const { return last_error_ ? last_error_() : ""; }

PoolScope::PoolScope(ThreadPool* pool) : previous_(tls_pool) { tls_pool = pool; }
PoolScope::~PoolScope() { tls_pool = previous_; }

}  // namespace packrt
