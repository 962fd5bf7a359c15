#include "common/thread_pool.h"

#include <algorithm>

namespace gridsync {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i)
    workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunTasks(int slot) {
  for (size_t i = next_.fetch_add(1); i < task_count_.load(); i = next_.fetch_add(1))
    (*task_.load())(i, slot);
}

void ThreadPool::WorkerLoop(int slot) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      ++busy_;
    }
    RunTasks(slot);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --busy_;
    }
    done_.notify_all();
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  ParallelForSlots(n, [&fn](size_t i, int) { fn(i); });
}

void ThreadPool::ParallelForSlots(size_t n, const std::function<void(size_t, int)>& fn) {
  if (workers_.empty() || n <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  {
    // A worker that woke late for the previous loop may still be draining
    // it; resetting the counters under its feet would run an index twice.
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return busy_ == 0; });
    task_ = &fn;
    task_count_ = n;
    next_.store(0);
    ++generation_;
  }
  wake_.notify_all();
  RunTasks(0);
  std::unique_lock<std::mutex> lock(mu_);
  // Workers that woke late find no index left and leave at once; waiting for
  // busy_ == 0 after our own share keeps `fn` alive until all calls returned.
  done_.wait(lock, [&] { return busy_ == 0 && next_.load() >= n; });
  task_ = nullptr;
}

}  // namespace gridsync
