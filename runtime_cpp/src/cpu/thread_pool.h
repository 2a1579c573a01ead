// The thread pool behind TVM's parallel loops. Workers spin briefly before sleeping: a pool that
// only sleeps on a condition variable was 5x slower on small kernels (futex wake-up per launch).
#pragma once
#include <packrt/kernel_abi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace packrt {

using ParallelEnv = packrt_parallel_env;  // TVM's TVMParallelGroupEnv
using ParallelLambda = int (*)(int task_id, ParallelEnv* env, void* cdata);

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn for tasks [0, num_task) (0: one per thread); the caller runs task 0. If another
  // thread is using the pool, runs everything on the calling thread as a single task, which
  // TVM's lambdas support (they split work by env->num_task). Returns 0 or -1 if a task failed.
  // `error_text` reads the calling thread's last kernel error: when only worker tasks failed, the
  // first one's text goes to `worker_error` (the caller, who reports the failure, cannot see
  // another thread's error); when task 0 failed, the caller's own error text stands.
  int launch(ParallelLambda fn, void* cdata, int num_task, const char* (*error_text)() = nullptr,
             std::string* worker_error = nullptr);

 private:
  void worker(int id);
  void shutdown();   // stops and joins the workers
  std::vector<std::thread> workers_;
  std::mutex launch_mu_, sleep_mu_;
  std::condition_variable wake_;
  ParallelLambda fn_ = nullptr;
  const char* (*error_text_)() = nullptr;
  std::mutex error_mu_;
  std::string worker_error_;
  void* cdata_ = nullptr;
  ParallelEnv env_{};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0}, failed_{0}, sleepers_{0};
  std::atomic<bool> stop_{false};
};

// TVMBackendParallelBarrier: all tasks of the current launch wait for each other.
int parallel_barrier(int task_id, ParallelEnv* env);

}  // namespace packrt
