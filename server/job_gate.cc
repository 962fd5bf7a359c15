#include "server/job_gate.h"

#include <string>
#include <utility>

namespace gridsync {
namespace {

// Jobs in order, and epochs in order within a job.
std::pair<uint64_t, uint32_t> Position(uint64_t job, uint32_t epoch) { return {job, epoch}; }

std::string Describe(uint64_t job, uint32_t epoch) {
  return "job " + std::to_string(job) + (epoch > 0 ? ", epoch " + std::to_string(epoch) : "");
}

}  // namespace

void JobGate::SetSource(Source source) {
  std::lock_guard<std::mutex> lock(source_mu_);
  source_ = std::move(source);
}

void JobGate::Open(uint64_t job, uint32_t epoch) {
  job_.store(job, std::memory_order_relaxed);
  epoch_.store(epoch, std::memory_order_relaxed);
  closed_.store(false, std::memory_order_release);
}

Result<JobGate::Admission> JobGate::Admit(uint64_t job, uint32_t epoch, uint32_t worker,
                                          Clock::time_point received) {
  if (closed_.load(std::memory_order_acquire)) {
    return Status::IOError("shard " + std::to_string(shard_) +
                           " serves nothing until the coordinator admitted it (registration, "
                           "or a rejoin from a checkpoint); allowed: the job's current epoch, "
                           "once the shard is in the cluster map");
  }
  const uint64_t current_job = job_.load(std::memory_order_relaxed);
  const uint32_t current_epoch = epoch_.load(std::memory_order_relaxed);
  const auto mine = Position(current_job, current_epoch);
  const auto claimed = Position(job, epoch);
  if (claimed == mine) return Admission{};
  if (claimed < mine) {
    if (job < current_job) {
      return Status::InvalidArgument(
          "worker " + std::to_string(worker) + " of job " + std::to_string(job) +
          " is stale: shard " + std::to_string(shard_) + " serves job " +
          std::to_string(current_job) + " now; allowed: the workers of job " +
          std::to_string(current_job) + " (stop what is left of the old job)");
    }
    return Status::InvalidArgument(
        "worker " + std::to_string(worker) + " of " + Describe(job, epoch) +
        " is stale: the job rolled back to a checkpoint and shard " + std::to_string(shard_) +
        " serves epoch " + std::to_string(current_epoch) + " now; allowed: epoch " +
        std::to_string(current_epoch) + " (the worker rolls back too)");
  }
  Clock::time_point retry_at;
  GRIDSYNC_ASSIGN_OR_RETURN(const std::optional<JobState> confirmed,
                            Confirm(job, epoch, received, &retry_at));
  if (!confirmed) return Admission{Verdict::kWait, 0, retry_at};
  const JobState& state = *confirmed;
  if (claimed > Position(state.job, state.epoch)) {
    return Status::InvalidArgument(Describe(job, epoch) + " of worker " + std::to_string(worker) +
                                   " is not the cluster's: the coordinator runs " +
                                   Describe(state.job, state.epoch) +
                                   "; allowed: " + Describe(state.job, state.epoch));
  }
  if (claimed < Position(state.job, state.epoch)) {
    // Behind the cluster: a fresh shard (job 0) would otherwise take the
    // claim as its job and mix a finished job's gradients into the next.
    return Status::InvalidArgument(Describe(job, epoch) + " of worker " + std::to_string(worker) +
                                   " is stale: the coordinator runs " +
                                   Describe(state.job, state.epoch) +
                                   "; allowed: " + Describe(state.job, state.epoch));
  }
  Admission moved;
  if (current_job == 0) {
    moved.verdict = Verdict::kCurrent;  // a fresh shard's first job: nothing to clear
  } else if (state.job > current_job) {
    moved.verdict = Verdict::kNewJob;
  } else {
    moved.verdict = Verdict::kRollBack;
    moved.resume_step = state.resume_step;
  }
  job_.store(state.job, std::memory_order_relaxed);
  epoch_.store(state.epoch, std::memory_order_relaxed);
  return moved;
}

Result<std::optional<JobState>> JobGate::Confirm(uint64_t job, uint32_t epoch,
                                                 Clock::time_point received,
                                                 Clock::time_point* retry_at) {
  Source source;
  {
    std::lock_guard<std::mutex> lock(source_mu_);
    source = source_;
  }
  const uint64_t current = job_.load(std::memory_order_relaxed);
  if (!source) {
    // A shard outside any cluster serves its first job, as claimed.
    if (current == 0) return std::optional<JobState>(JobState{job, epoch, 0, {}});
    return Status::InvalidArgument(Describe(job, epoch) + " cannot be confirmed (shard " +
                                   std::to_string(shard_) + " has no coordinator); allowed: " +
                                   Describe(current, epoch_.load(std::memory_order_relaxed)));
  }
  const auto claim = Position(job, epoch);
  if (claim <= Position(confirmed_.job, confirmed_.epoch)) return std::optional(confirmed_);
  // The coordinator answered after this message arrived: the worker read
  // its claim from the coordinator's map before sending it, and the map
  // only moves forward, so that answer stands for it.
  if (last_answer_ && *last_answer_ >= received) return std::optional(confirmed_);
  const auto now = Clock::now();
  if (last_query_ && now < *last_query_ + min_interval_) {
    *retry_at = *last_query_ + min_interval_;
    return std::optional<JobState>();
  }
  // A question that fails is no answer: the claims waiting with this one
  // wait for the next question rather than be judged on the old state.
  last_query_ = now;
  auto asked = source();
  if (!asked.ok()) return asked.status().WithContext("confirming " + Describe(job, epoch));
  last_answer_ = now;
  confirmed_ = *asked;
  return std::optional(confirmed_);
}

}  // namespace gridsync
