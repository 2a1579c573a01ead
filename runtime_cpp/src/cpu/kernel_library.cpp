#include "cpu/kernel_library.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <packrt/kernel_abi.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "buffer.h"
#include "error.h"

namespace packrt {
namespace {

// Loading a kernel library (dlopen, then writing its hook variables) and unloading it, one thread
// at a time. glibc already serializes dlopen/dlclose under its loader lock, so this costs nothing,
// but ThreadSanitizer cannot see that lock: when a model is opened on one thread after another
// thread closed its own, the new library is often mapped where the old one was, and the two
// threads' writes to the same hook addresses looked like a data race.
std::mutex g_loader_mu;

thread_local ThreadPool* tls_pool = nullptr;
thread_local const KernelLibrary* tls_library = nullptr;
thread_local bool tls_together = false;   // the running kernel's launches need their tasks at once

int parallel_launch(ParallelLambda fn, void* cdata, int num_task) {
  if (tls_pool) {
    std::string worker_error;
    int rc = tls_pool->launch(fn, cdata, num_task, tls_together, tls_library ? tls_library->error_reader() : nullptr, &worker_error);
    if (rc != 0 && tls_library && !worker_error.empty()) tls_library->set_error(worker_error);
    return rc;
  }
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
void set_hook(void* slot, T value) {
  if (slot) *reinterpret_cast<T*>(slot) = value;
}

}  // namespace

// The ELF header, program and section header tables and every segment lie inside the file (a
// truncated kernels.so otherwise faults inside dlopen), for this machine's architecture.
static void check_elf(const uint8_t* d, size_t n, const std::string& label) {
  auto bad = [&](const std::string& why) { fail(PACKRT_ERROR_CORRUPT_PACKAGE, label + ": " + why); };
  ElfW(Ehdr) h;
  if (n < sizeof h || std::memcmp(d, ELFMAG, SELFMAG) != 0) bad("not an ELF shared library");
  std::memcpy(&h, d, sizeof h);
#if defined(__x86_64__)
  const int machine = EM_X86_64;
#elif defined(__aarch64__)
  const int machine = EM_AARCH64;
#else
  const int machine = h.e_machine;
#endif
  if (h.e_ident[EI_CLASS] != ELFCLASS64 || h.e_type != ET_DYN || h.e_machine != machine)
    bad("not a 64-bit shared library for this machine's architecture");
  if (h.e_phentsize != sizeof(ElfW(Phdr)) || h.e_phoff > n || h.e_phnum > (n - h.e_phoff) / sizeof(ElfW(Phdr)))
    bad("program headers outside the file (truncated?)");
  if (h.e_shnum && (h.e_shentsize != sizeof(ElfW(Shdr)) || h.e_shoff > n ||
                    h.e_shnum > (n - h.e_shoff) / sizeof(ElfW(Shdr))))
    bad("section headers outside the file (truncated?)");
  for (unsigned i = 0; i < h.e_phnum; ++i) {
    ElfW(Phdr) p;
    std::memcpy(&p, d + h.e_phoff + i * sizeof p, sizeof p);
    if (p.p_offset > n || p.p_filesz > n - p.p_offset) bad("a segment lies outside the file (truncated?)");
  }
}

// The checked bytes in a sealed in-memory file that dlopen maps: the code that runs is the code
// that was hashed, whatever happens to the package file afterwards.
static int sealed_memfd(const uint8_t* d, size_t n, const std::string& label) {
  int fd = static_cast<int>(::syscall(SYS_memfd_create, "packrt-kernels", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd < 0) fail(PACKRT_ERROR_RUNTIME, label + ": cannot create an in-memory file to load it from");
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::write(fd, d + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      ::close(fd);
      fail(PACKRT_ERROR_RUNTIME, label + ": cannot write its in-memory copy");
    }
    done += static_cast<size_t>(w);
  }
  ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  return fd;
}

KernelLibrary::KernelLibrary(const uint8_t* image, size_t size, const std::string& label) : path_(label) {
  check_elf(image, size, label);
  memfd_ = sealed_memfd(image, size, label);
  // the descriptor stays open while the library is loaded: dlopen matches libraries by path name,
  // so a reused /proc/self/fd/N would hand back another model's kernels
  std::string path = "/proc/self/fd/" + std::to_string(memfd_);
  std::lock_guard<std::mutex> loader(g_loader_mu);
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    ::close(memfd_);
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, label + ": cannot load kernels: " + dlerror());
  }
  auto abi = reinterpret_cast<int (*)()>(own_symbol("packrt_kernels_abi_version", true));
  last_error_ = reinterpret_cast<const char* (*)()>(own_symbol("packrt_kernels_last_error", true));
  set_error_ = reinterpret_cast<void (*)(const char*, const char*)>(own_symbol("TVMFFIErrorSetRaisedFromCStr", true));
  if (!abi || !last_error_ || !set_error_ || abi() != PACKRT_KERNEL_ABI_VERSION) {
    dlclose(handle_);
    ::close(memfd_);
    fail(PACKRT_ERROR_UNSUPPORTED, label + ": kernel library ABI does not match this runtime");
  }
  // The kernels' own weak hook variables (bound locally: the library is linked -Bsymbolic).
  set_hook(own_symbol("__TVMBackendAllocWorkspace", false), &alloc_workspace);
  set_hook(own_symbol("__TVMBackendFreeWorkspace", false), &free_workspace);
  set_hook(own_symbol("__TVMBackendParallelLaunch", false), &parallel_launch);
  set_hook<packrt_parallel_barrier_fn>(own_symbol("packrt_parallel_barrier", false), &parallel_barrier);
  // TVM's LLVM codegen calls the barrier through this hook variable of its own
  set_hook<packrt_parallel_barrier_fn>(own_symbol("__TVMBackendParallelBarrier", false), &parallel_barrier);
}

KernelLibrary::~KernelLibrary() {
  if (handle_) {
    std::lock_guard<std::mutex> loader(g_loader_mu);
    dlclose(handle_);
  }
  if (memfd_ >= 0) ::close(memfd_);
}

void* KernelLibrary::own_symbol(const char* name, bool function) const {
  void* p = dlsym(handle_, name);
  Dl_info info{};
  void* entry = nullptr;
  if (!p || !dladdr1(p, &info, &entry, RTLD_DL_SYMENT) || !entry || info.dli_saddr != p)
    return nullptr;
  // defined in kernels.so itself (dlsym also searches its dependencies: libc's exit, abort, ...)
  struct link_map* lm = nullptr;
  if (dlinfo(handle_, RTLD_DI_LINKMAP, &lm) != 0 || !lm || reinterpret_cast<uintptr_t>(info.dli_fbase) == 0 ||
      std::string(info.dli_fname ? info.dli_fname : "") != lm->l_name)
    return nullptr;
  int type = ELF64_ST_TYPE(static_cast<const ElfW(Sym)*>(entry)->st_info);
  return (function ? type == STT_FUNC : type == STT_OBJECT) ? p : nullptr;
}

PackedKernel KernelLibrary::kernel(const std::string& symbol) const {
  // only the packed kernels TVM generates (__tvm_ffi_<name>), defined in kernels.so, as functions
  void* f = symbol.rfind(kKernelPrefix, 0) == 0 ? own_symbol(symbol.c_str(), true) : nullptr;
  if (!f) fail(PACKRT_ERROR_CORRUPT_PACKAGE, path_ + " has no kernel function '" + symbol + "'");
  return reinterpret_cast<PackedKernel>(f);
}

std::string KernelLibrary::last_error() const { return last_error_ ? last_error_() : ""; }

void KernelLibrary::set_error(const std::string& text) const {
  size_t colon = text.find(": ");
  std::string kind = colon == std::string::npos ? "Error" : text.substr(0, colon);
  std::string msg = colon == std::string::npos ? text : text.substr(colon + 2);
  set_error_(kind.c_str(), msg.c_str());
}

PoolScope::PoolScope(ThreadPool* pool, const KernelLibrary* library) : previous_(tls_pool), previous_library_(tls_library) {
  tls_pool = pool;
  tls_library = library;
}
PoolScope::~PoolScope() {
  tls_pool = previous_;
  tls_library = previous_library_;
  tls_together = false;
}

void PoolScope::next_kernel(bool together) { tls_together = together; }

}  // namespace packrt
