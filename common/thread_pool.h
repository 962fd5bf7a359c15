// A fixed pool of worker threads for data-parallel loops in the CPU kernels.
//
// ParallelFor(n, fn) runs fn(i) for i in [0, n) on the pool and the calling
// thread, and returns when every call has finished. Which thread runs which
// index is unspecified, so kernels that need a fixed reduction order must
// make each index own its output (for example one index per grid level).
// A pool of one thread runs everything inline on the caller.
//
// ParallelForSlots(n, fn) also tells fn(i, slot) which thread runs it: slot
// is in [0, size()), 0 for the calling thread, and no two calls running at
// once share a slot. Scratch kept per slot, instead of per index, is reused
// by every index a thread runs, so it stays in that core's caches (the
// MLP's workspace: worker/model.cc).
//
// Thread safety: ParallelFor may be called from one thread at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gridsync {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);
  void ParallelForSlots(size_t n, const std::function<void(size_t index, int slot)>& fn);

 private:
  void WorkerLoop(int slot);
  void RunTasks(int slot);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  // Written under mu_, read lock-free by workers draining indices.
  std::atomic<const std::function<void(size_t, int)>*> task_{nullptr};
  std::atomic<size_t> task_count_{0};
  uint64_t generation_ = 0;  // guarded by mu_
  int busy_ = 0;             // guarded by mu_
  bool stop_ = false;        // guarded by mu_
  std::atomic<size_t> next_{0};
};

// pool->ParallelFor(n, fn) where a pool is given (and there is more than
// one index), else fn(0..n) on the calling thread: for code whose pool is
// optional.
inline void ParallelForOn(ThreadPool* pool, size_t n, const std::function<void(size_t)>& fn) {
  if (pool != nullptr && n > 1) {
    pool->ParallelFor(n, fn);
  } else {
    for (size_t i = 0; i < n; ++i) fn(i);
  }
}

// The same for ParallelForSlots: slot 0 on the calling thread.
inline void ParallelForSlotsOn(ThreadPool* pool, size_t n,
                               const std::function<void(size_t index, int slot)>& fn) {
  if (pool != nullptr && n > 1) {
    pool->ParallelForSlots(n, fn);
  } else {
    for (size_t i = 0; i < n; ++i) fn(i, 0);
  }
}

}  // namespace gridsync
