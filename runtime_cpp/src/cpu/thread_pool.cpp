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

#include <string>
#include <system_error>

#include "error.h"

namespace packrt {
namespace {

constexpr int kSpinsBeforeSleep = 1 << 16;  // tens of microseconds

struct Barrier {
  std::atomic<int> arrived{0};
  std::atomic<int> phase{0};
};

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
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

void ThreadPool::worker(int id) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && !stop_.load(std::memory_order_relaxed)) {
      if (++spins < kSpinsBeforeSleep) {
        PACKRT_PAUSE();
        continue;
      }
      std::unique_lock<std::mutex> l(sleep_mu_);
      ++sleepers_;
      wake_.wait(l, [&] { return stop_.load() || generation_.load() != seen; });
      --sleepers_;
      spins = 0;
    }
    if (stop_) return;
    seen = generation_.load(std::memory_order_acquire);
    if (id < env_.num_task && fn_(id, &env_, cdata_) != 0) {
      failed_ = 1;
      std::lock_guard<std::mutex> l(error_mu_);
      if (worker_error_.empty())
        worker_error_ = (error_text_ ? std::string(error_text_()) : "") + " (in parallel task " + std::to_string(id) + ")";
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

int ThreadPool::launch(ParallelLambda fn, void* cdata, int num_task, const char* (*error_text)(),
                       std::string* worker_error) {
  std::unique_lock<std::mutex> busy(launch_mu_, std::try_to_lock);
  int n = (num_task <= 0 || num_task > num_threads()) ? num_threads() : num_task;
  if (!busy.owns_lock() || n == 1 || workers_.empty()) {
    Barrier bar;
    ParallelEnv env{&bar, 1};
    return fn(0, &env, cdata) == 0 ? 0 : -1;
  }
  Barrier bar;
  fn_ = fn;
  cdata_ = cdata;
  error_text_ = error_text;
  worker_error_.clear();
  env_ = ParallelEnv{&bar, n};
  failed_ = 0;
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_release);
  {
    std::lock_guard<std::mutex> l(sleep_mu_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (sleepers_.load()) wake_.notify_all();
  bool caller_failed = fn(0, &env_, cdata) != 0;
  while (pending_.load(std::memory_order_acquire) != 0) PACKRT_PAUSE();
  if (failed_ && !caller_failed && worker_error) {
    std::lock_guard<std::mutex> l(error_mu_);
    *worker_error = worker_error_;
  }
  return caller_failed || failed_ ? -1 : 0;
}

int parallel_barrier(int /*task_id*/, ParallelEnv* env) {
  if (env->num_task <= 1) return 0;
  auto* b = static_cast<Barrier*>(env->sync_handle);
  int phase = b->phase.load(std::memory_order_acquire);
  if (b->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == env->num_task) {
    b->arrived.store(0, std::memory_order_relaxed);
    b->phase.fetch_add(1, std::memory_order_acq_rel);
  } else {
    while (b->phase.load(std::memory_order_acquire) == phase) std::this_thread::yield();
  }
  return 0;
}

}  // namespace packrt
