#include "cpu/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define PACKRT_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define PACKRT_PAUSE() asm volatile("yield")
#else
#define PACKRT_PAUSE() \
  do {                 \
  } while (0)
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <system_error>

#include "error.h"

namespace packrt {
namespace {

using Clock = std::chrono::steady_clock;

// A share's word: launch tag (32 bits) | next chunk (16) | end (16). A claim is one CAS, and a
// claim with a stale tag fails, so a worker that wakes late never runs a chunk of a later launch.
constexpr int kMaxChunks = 0xFFFF;
constexpr uint64_t pack(uint64_t tag, uint64_t next, uint64_t end) { return tag << 32 | next << 16 | end; }
constexpr uint64_t tag_of(uint64_t w) { return w >> 32; }
constexpr int next_of(uint64_t w) { return static_cast<int>(w >> 16 & 0xFFFF); }
constexpr int end_of(uint64_t w) { return static_cast<int>(w & 0xFFFF); }

// The launch's sync handle (env->sync_handle): a barrier for `together` launches; for the others
// it records that a kernel called the barrier anyway.
struct Sync {
  bool together = false;
  std::atomic<int> arrived{0}, phase{0}, misused{0};
};

const char kBarrierMisuse[] =
    "RuntimeError: a kernel called TVMBackendParallelBarrier, but its plan entry does not mark it "
    "\"parallel\": \"together\" (its tasks must run at once); rebuild the package with this packager";

// Spins for `policy.spin_us`, then yields for `policy.yield_us`; true as soon as `ready()` holds,
// false when the caller should block.
template <typename Ready>
bool spin_then_yield(const WaitPolicy& policy, Ready ready) {
  const auto start = Clock::now();
  const auto spin = std::chrono::microseconds(policy.spin_us);
  const auto total = spin + std::chrono::microseconds(policy.yield_us);
  for (unsigned i = 0;; ++i) {
    if (ready()) return true;
    if (i % 16 == 0) {
      auto elapsed = Clock::now() - start;
      if (elapsed >= total) return false;
      if (elapsed >= spin) {
        std::this_thread::yield();
        continue;
      }
    }
    PACKRT_PAUSE();
  }
}

int env_microseconds(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long us = std::strtol(v, &end, 10);
  if (*end || us < 0 || us > 1000000)
    throw Failure(PACKRT_ERROR_INVALID_ARGUMENT,
                  std::string(name) + "='" + v + "': expected a whole number of microseconds, 0 to 1000000");
  return static_cast<int>(us);
}

}  // namespace

struct ThreadPool::Launch {
  ParallelLambda fn;
  void* cdata;
  void* sync;
  int chunks;
  bool together;
  const char* (*error_text)();
};

WaitPolicy WaitPolicy::from_environment() {
  WaitPolicy p;
  p.spin_us = env_microseconds("PACKRT_SPIN_US", p.spin_us);
  p.yield_us = env_microseconds("PACKRT_YIELD_US", p.yield_us);
  return p;
}

ThreadPool::ThreadPool(int num_threads, WaitPolicy wait)
    : wait_(wait), shares_(new Share[static_cast<size_t>(std::max(num_threads, 1))]) {
  try {
    for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker(i); });
  } catch (const std::system_error& e) {   // the system refused a thread: stop the ones started
    shutdown();
    throw Failure(PACKRT_ERROR_RUNTIME, "cannot start " + std::to_string(num_threads) + " threads (" + e.what() +
                                            "); ask for fewer threads");
  }
}

ThreadPool::~ThreadPool() { shutdown(); }

void ThreadPool::shutdown() {
  stop_ = true;
  {
    std::lock_guard<std::mutex> l(sleep_mu_);
  }
  wake_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
}

bool ThreadPool::take_own(int self, uint64_t tag, int* chunk) {
  std::atomic<uint64_t>& w = shares_[self].word;
  uint64_t cur = w.load(std::memory_order_acquire);
  while (tag_of(cur) == tag && next_of(cur) < end_of(cur)) {
    if (w.compare_exchange_weak(cur, cur + (uint64_t{1} << 16), std::memory_order_acq_rel,
                                std::memory_order_acquire)) {
      *chunk = next_of(cur);
      return true;
    }
  }
  return false;
}

bool ThreadPool::steal(int self, uint64_t tag, int* chunk) {
  const int n = num_threads();
  for (int k = 1; k < n; ++k) {
    std::atomic<uint64_t>& w = shares_[(self + k) % n].word;
    uint64_t cur = w.load(std::memory_order_acquire);
    while (tag_of(cur) == tag && next_of(cur) < end_of(cur)) {
      if (w.compare_exchange_weak(cur, cur - 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        *chunk = end_of(cur) - 1;
        return true;
      }
    }
  }
  return false;
}

void ThreadPool::finish_chunk() {
  // seq_cst pairs with the caller's caller_sleeping_ store before it re-checks finished_
  finished_.fetch_add(1);
  if (caller_sleeping_.load()) {
    std::lock_guard<std::mutex> l(sleep_mu_);
    done_.notify_one();
  }
}

void ThreadPool::record_error(const Launch& l, int chunk) {
  failed_ = 1;
  std::lock_guard<std::mutex> g(error_mu_);
  if (worker_error_.empty())
    worker_error_ = (l.error_text ? std::string(l.error_text()) : "") + " (in parallel task " + std::to_string(chunk) + ")";
}

void ThreadPool::run_chunks(int self, const Launch& l, uint64_t tag) {
  int chunk = 0;
  while (take_own(self, tag, &chunk) || (!l.together && steal(self, tag, &chunk))) {
    ParallelEnv env{l.sync, l.chunks};
    if (l.fn(chunk, &env, l.cdata) != 0) record_error(l, chunk);
    finish_chunk();
  }
}

void ThreadPool::worker(int id) {
  uint64_t seen = 0;
  for (;;) {
    auto fresh = [&] { return generation_.load() != seen || stop_.load(std::memory_order_relaxed); };
    if (!spin_then_yield(wait_, fresh)) {
      std::unique_lock<std::mutex> l(sleep_mu_);
      ++sleepers_;
      wake_.wait(l, fresh);
      --sleepers_;
    }
    if (stop_) return;
    seen = generation_.load(std::memory_order_acquire);
    // What this reads may already belong to a later launch; then every claim below fails (tag).
    Launch l{fn_.load(std::memory_order_relaxed), cdata_.load(std::memory_order_relaxed),
             sync_.load(std::memory_order_relaxed), chunks_.load(std::memory_order_relaxed),
             together_.load(std::memory_order_relaxed), error_text_.load(std::memory_order_relaxed)};
    run_chunks(id, l, seen & 0xFFFFFFFFu);
  }
}

void ThreadPool::wait_for_chunks(int total) {
  auto done = [&] { return finished_.load() >= total; };
  if (spin_then_yield(wait_, done)) return;
  std::unique_lock<std::mutex> l(sleep_mu_);
  caller_sleeping_ = true;   // seq_cst: a worker finishing after this sees it and notifies
  done_.wait(l, done);
  caller_sleeping_ = false;
}

int ThreadPool::launch(ParallelLambda fn, void* cdata, int num_task, bool together, const char* (*error_text)(),
                       std::string* worker_error) {
  std::unique_lock<std::mutex> busy(launch_mu_, std::try_to_lock);
  const int threads = num_threads();
  int chunks = together ? (num_task > 0 ? std::min(num_task, threads) : threads)
                        : (num_task > 0 ? std::min(num_task, kMaxChunks) : threads * kChunksPerThread);
  Sync sync;
  sync.together = together;
  if (!busy.owns_lock() || threads == 1 || chunks == 1) {
    ParallelEnv env{&sync, 1};
    int rc = fn(0, &env, cdata);
    return rc == 0 ? 0 : -1;
  }
  const uint64_t gen = generation_.load(std::memory_order_relaxed) + 1;
  const uint64_t tag = gen & 0xFFFFFFFFu;
  Launch l{fn, cdata, &sync, chunks, together, error_text};
  fn_.store(fn, std::memory_order_relaxed);
  cdata_.store(cdata, std::memory_order_relaxed);
  sync_.store(&sync, std::memory_order_relaxed);
  chunks_.store(chunks, std::memory_order_relaxed);
  together_.store(together, std::memory_order_relaxed);
  error_text_.store(error_text, std::memory_order_relaxed);
  finished_.store(0, std::memory_order_relaxed);
  failed_.store(0, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> g(error_mu_);
    worker_error_.clear();
  }
  for (int t = 0; t < threads; ++t) {
    // together: task t on thread t; otherwise thread t's contiguous share of the chunks
    int begin = together ? std::min(t, chunks) : static_cast<int>(int64_t{chunks} * t / threads);
    int end = together ? std::min(t + 1, chunks) : static_cast<int>(int64_t{chunks} * (t + 1) / threads);
    shares_[t].word.store(pack(tag, begin, end), std::memory_order_relaxed);
  }
  generation_.store(gen);   // seq_cst: publishes the above, and pairs with sleepers_ below
  if (sleepers_.load()) {
    std::lock_guard<std::mutex> g(sleep_mu_);
    wake_.notify_all();
  }

  run_chunks(0, l, tag);
  wait_for_chunks(chunks);

  if (sync.misused.load()) {
    if (worker_error) *worker_error = kBarrierMisuse;
    return -1;
  }
  if (!failed_) return 0;
  if (worker_error) {
    std::lock_guard<std::mutex> g(error_mu_);
    *worker_error = worker_error_;
  }
  return -1;
}

int parallel_barrier(int /*task_id*/, ParallelEnv* env) {
  if (env->num_task <= 1) return 0;
  auto* s = static_cast<Sync*>(env->sync_handle);
  if (!s->together) {   // tasks that may run one after another on one thread would wait forever
    s->misused = 1;
    return -1;
  }
  int phase = s->phase.load(std::memory_order_acquire);
  if (s->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == env->num_task) {
    s->arrived.store(0, std::memory_order_relaxed);
    s->phase.fetch_add(1, std::memory_order_acq_rel);
  } else {
    while (s->phase.load(std::memory_order_acquire) == phase) std::this_thread::yield();
  }
  return 0;
}

}  // namespace packrt
