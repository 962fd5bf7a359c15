#include "server/job_gate.h"

#include <string>

namespace gridsync {

void JobGate::SetSource(Source source) {
  std::lock_guard<std::mutex> lock(source_mu_);
  source_ = std::move(source);
}

Result<JobGate::Verdict> JobGate::Admit(uint64_t job, uint32_t worker) {
  const uint64_t current = job_.load(std::memory_order_relaxed);
  if (job == current) return Verdict::kCurrent;
  if (job < current) {
    return Status::InvalidArgument("worker " + std::to_string(worker) + " of job " +
                                   std::to_string(job) + " is stale: shard " +
                                   std::to_string(shard_) + " serves job " +
                                   std::to_string(current) + " now; allowed: the workers of job " +
                                   std::to_string(current) + " (stop what is left of the old job)");
  }
  GRIDSYNC_RETURN_IF_ERROR(Confirm(job));
  job_.store(job, std::memory_order_relaxed);
  // The first job of a fresh shard is no new job: there is nothing to clear.
  return current == 0 ? Verdict::kCurrent : Verdict::kNewJob;
}

Status JobGate::Confirm(uint64_t job) {
  Source source;
  {
    std::lock_guard<std::mutex> lock(source_mu_);
    source = source_;
  }
  const uint64_t current = job_.load(std::memory_order_relaxed);
  if (!source) {
    if (current == 0) return Status::OK();  // a shard outside any cluster: its first job
    return Status::InvalidArgument("job " + std::to_string(job) + " cannot be confirmed (shard " +
                                   std::to_string(shard_) + " has no coordinator); allowed: job " +
                                   std::to_string(current));
  }
  const auto now = std::chrono::steady_clock::now();
  if (job > confirmed_ && now - last_query_ >= std::chrono::milliseconds(10)) {
    last_query_ = now;
    auto asked = source();
    if (!asked.ok()) return asked.status().WithContext("confirming job " + std::to_string(job));
    confirmed_ = *asked;
  }
  if (job > confirmed_) {
    return Status::InvalidArgument(
        "job " + std::to_string(job) + " is not the cluster's: the coordinator runs job " +
        std::to_string(confirmed_) + "; allowed: job " + std::to_string(confirmed_));
  }
  return Status::OK();
}

}  // namespace gridsync
