#include "server/job_gate.h"

#include <exception>
#include <string>
#include <system_error>
#include <utility>

namespace gridsync {
namespace {

// Jobs in order, and epochs in order within a job.
std::pair<uint64_t, uint32_t> Position(uint64_t job, uint32_t epoch) { return {job, epoch}; }

std::string Describe(uint64_t job, uint32_t epoch) {
  return "job " + std::to_string(job) + (epoch > 0 ? ", epoch " + std::to_string(epoch) : "");
}

}  // namespace

JobGate::~JobGate() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wanted_.notify_all();
  if (asker_.joinable()) asker_.join();
}

void JobGate::SetSource(Source source) {
  std::lock_guard<std::mutex> lock(mu_);
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
  // How soon a claim looks again while the question is out: the answer
  // takes a round trip to the coordinator (well under a millisecond when
  // it is well), and a look is a lock and a few comparisons.
  constexpr auto kLookAgain = std::chrono::milliseconds(2);
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t current = job_.load(std::memory_order_relaxed);
  if (!source_) {
    // A shard outside any cluster serves its first job, as claimed.
    if (current == 0) return std::optional<JobState>(JobState{job, epoch, 0, {}});
    return Status::InvalidArgument(Describe(job, epoch) + " cannot be confirmed (shard " +
                                   std::to_string(shard_) + " has no coordinator); allowed: " +
                                   Describe(current, epoch_.load(std::memory_order_relaxed)));
  }
  const auto claim = Position(job, epoch);
  if (claim <= Position(confirmed_.job, confirmed_.epoch)) return std::optional(confirmed_);
  // The coordinator answered a question asked after this message arrived:
  // the worker read its claim from the coordinator's map before sending
  // it, and the map only moves forward, so that answer stands for it.
  if (last_answer_ && *last_answer_ >= received) return std::optional(confirmed_);
  // A question that failed is no answer: the first claim it would have
  // judged is told why; the others wait for the next question rather than
  // be judged on the old state.
  if (failure_ && failed_at_ >= received) {
    Status failed = std::move(*failure_);
    failure_.reset();
    return failed.WithContext("confirming " + Describe(job, epoch));
  }
  const auto now = Clock::now();
  if (asking_) {
    *retry_at = now + kLookAgain;
    return std::optional<JobState>();
  }
  if (last_query_ && now < *last_query_ + min_interval_) {
    *retry_at = *last_query_ + min_interval_;
    return std::optional<JobState>();
  }
  if (!asker_.joinable()) {
    // A thread the system refuses (its thread limit) is this claim's
    // error, not the serving loop's end; the next claim tries again.
    try {
      asker_ = std::thread([this] { AskLoop(); });
    } catch (const std::system_error& e) {
      return Status::IOError("shard " + std::to_string(shard_) +
                             " cannot start the thread that asks the coordinator about " +
                             Describe(job, epoch) + ": " + e.what());
    }
  }
  last_query_ = now;
  asking_ = true;
  lock.unlock();
  wanted_.notify_one();
  *retry_at = now + kLookAgain;
  return std::optional<JobState>();
}

void JobGate::AskLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wanted_.wait(lock, [&] { return stopping_ || asking_; });
    if (stopping_) return;
    const Source source = source_;
    const Clock::time_point asked_at = *last_query_;
    lock.unlock();
    // An exception here would end the process (the thread's own): it is
    // this question's failure instead.
    Result<JobState> asked = Status::IOError("the question was not asked");
    try {
      asked = source();
    } catch (const std::exception& e) {
      asked = Status::IOError(std::string("asking the coordinator threw: ") + e.what());
    }
    lock.lock();
    if (asked.ok()) {
      confirmed_ = *asked;
      last_answer_ = asked_at;
      failure_.reset();
    } else {
      failure_ = asked.status();
      failed_at_ = asked_at;
    }
    asking_ = false;
  }
}

}  // namespace gridsync
