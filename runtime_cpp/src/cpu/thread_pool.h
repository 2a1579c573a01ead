// The thread pool behind TVM's parallel loops, built for machines whose cores other processes
// share. A launch splits the loop into chunks (TVM's lambdas split their loop by env->num_task);
// each thread first runs the chunks of its own contiguous share, then takes unstarted chunks from
// the other shares, so a worker that the OS has descheduled costs at most the one chunk it has in
// flight. Waiting (a worker for the next launch, the caller for chunks in flight) spins for a
// measured while, then yields the core, then blocks: nobody burns a core on a thread that is not
// running. Kernels that call TVMBackendParallelBarrier need every task running at once; the plan
// marks them (`"parallel": "together"`) and their launches keep one task per thread.
#pragma once
#include <packrt/kernel_abi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace packrt {

using ParallelEnv = packrt_parallel_env;  // TVM's TVMParallelGroupEnv
using ParallelLambda = int (*)(int task_id, ParallelEnv* env, void* cdata);

// How long a waiting thread spins, then yields, before it blocks (microseconds). The defaults and
// the measurements behind them are in docs/runtime.md; PACKRT_SPIN_US / PACKRT_YIELD_US override.
struct WaitPolicy {
  int spin_us = 50;
  int yield_us = 200;
  static WaitPolicy from_environment();
};

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads, WaitPolicy wait = WaitPolicy::from_environment());
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn over a loop split into chunks (num_task > 0: that many; 0: kChunksPerThread per
  // thread) and returns when every chunk has run; the caller runs chunks too. `together`: one task
  // per thread, all running at once (kernels that call the barrier). If another thread is using
  // the pool, runs everything on the calling thread as a single task, which TVM's lambdas support.
  // Returns 0, or -1 if a task failed; then `worker_error` gets the first failure's text (read with
  // `error_text`, the kernel library's reader of the calling thread's last error, on the thread
  // that ran the failing task) and its task number.
  int launch(ParallelLambda fn, void* cdata, int num_task, bool together,
             const char* (*error_text)() = nullptr, std::string* worker_error = nullptr);

  static constexpr int kChunksPerThread = 4;

 private:
  struct alignas(64) Share {        // one thread's chunks: tag (launch) | next | end, packed
    std::atomic<uint64_t> word{0};
  };
  struct Launch;                    // what a launch publishes to the workers

  void worker(int id);
  void run_chunks(int self, const Launch& l, uint64_t tag);
  bool take_own(int self, uint64_t tag, int* chunk);
  bool steal(int self, uint64_t tag, int* chunk);
  void record_error(const Launch& l, int chunk);   // the first failed chunk's text, on its thread
  void finish_chunk();
  void wait_for_chunks(int total);
  void shutdown();   // stops and joins the workers

  WaitPolicy wait_;
  std::vector<std::thread> workers_;
  std::unique_ptr<Share[]> shares_;
  std::mutex launch_mu_;

  // published per launch (atomics: a late worker may read them while the next launch writes them;
  // a claim that succeeds with the launch's tag proves what it read belongs to that launch)
  std::atomic<uint64_t> generation_{0};
  std::atomic<ParallelLambda> fn_{nullptr};
  std::atomic<void*> cdata_{nullptr}, sync_{nullptr};
  std::atomic<int> chunks_{0};
  std::atomic<bool> together_{false};
  std::atomic<const char* (*)()> error_text_{nullptr};

  std::atomic<int> finished_{0}, failed_{0};
  std::mutex error_mu_;
  std::string worker_error_;

  // blocking: workers wait for a new generation, the caller for the last chunk in flight
  std::mutex sleep_mu_;
  std::condition_variable wake_, done_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_sleeping_{false}, stop_{false};
};

// TVMBackendParallelBarrier: all tasks of a `together` launch wait for each other. Called from a
// launch that does not run its tasks together, it fails the launch instead of hanging.
int parallel_barrier(int task_id, ParallelEnv* env);

}  // namespace packrt
