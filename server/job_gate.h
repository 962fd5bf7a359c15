// Which job a long-running shard serves (a systemd unit outlives jobs). Every
// worker message carries its job, the cluster map's: an older job's message
// is refused, naming its worker; a newer job is admitted once the
// coordinator confirms it began, and the shard then starts afresh. A
// message's claim alone never moves the job: a corrupt or hostile one would
// wipe a running job. The coordinator is asked at most every 10 ms, so a
// flood of messages claiming future jobs cannot load it.
//
// Thread safety: Admit on the shard's I/O thread only; SetSource and job()
// from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>

#include "common/status.h"

namespace gridsync {

class JobGate {
 public:
  using Source = std::function<Result<uint64_t>()>;

  explicit JobGate(uint32_t shard) : shard_(shard) {}

  // Where the cluster's job is read (the coordinator's map). Without one,
  // the first job seen is served and no other.
  void SetSource(Source source);

  enum class Verdict { kCurrent, kNewJob };
  // The job of a message from `worker`: the current one, a new one that
  // began (the caller starts afresh; job() is already the new one), or an
  // error naming the worker and what is allowed.
  Result<Verdict> Admit(uint64_t job, uint32_t worker);

  uint64_t job() const { return job_.load(std::memory_order_relaxed); }

 private:
  Status Confirm(uint64_t job);

  const uint32_t shard_;
  std::atomic<uint64_t> job_{0};  // 0: none yet
  uint64_t confirmed_ = 0;        // the coordinator's job when last asked
  std::chrono::steady_clock::time_point last_query_{};
  std::mutex source_mu_;
  Source source_;  // guarded by source_mu_
};

}  // namespace gridsync
