// Which job, and which epoch of it, a shard serves. A long-running shard (a
// systemd unit) outlives jobs, and a job survives a shard's restart by
// rolling back to a checkpoint: the coordinator's map then moves the job's
// epoch. Every worker message carries the job and epoch of the map it
// follows:
//   - an older job or epoch is refused, naming the worker and what is
//     current (the worker then rolls back itself);
//   - a newer one is admitted once the coordinator confirms it, and the
//     shard then starts afresh (a new job) or reloads its checkpoint of the
//     step the job rolled back to (a new epoch).
// A message's claim alone never moves the gate: a corrupt or hostile one
// would wipe a running job. The coordinator is asked at most every 10 ms,
// and a claim is judged by the first answer given after the message
// arrived: one the coordinator was asked after is refused on that answer;
// one that arrived since waits (kWait: the caller sets it aside, and its
// serving loop goes on) until the next question may be asked. A flood of
// messages claiming the future, however they vary, costs one question per
// 10 ms and never stalls the serving loop (it slept until the next
// question, 10 ms per message, when each claim was lower than the last).
// The question itself is asked on a thread of the gate's own, and the
// claims wait (kWait) while it is out: asked on the serving thread, a
// coordinator that was stopped or cut off held every worker of the shard
// up for the client's reply timeout (up to 10 s) per question, a flood
// of claims every 10 ms.
//
// A restarted shard starts closed: it serves nothing until its registration
// told it the job and epoch it rejoined (Open); the shard holds what arrives
// meanwhile and admits it then.
//
// Thread safety: Admit on the shard's I/O thread only; SetSource, Open and
// the accessors from any thread. The source is called on the gate's
// question thread, one call at a time; the destructor waits out a call in
// flight (at most the source's own timeout), so the source must outlive
// the gate.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "common/cluster_map.h"
#include "common/status.h"

namespace gridsync {

class JobGate {
 public:
  using Source = std::function<Result<JobState>()>;

  // closed: a rejoining shard, which serves nothing until Open.
  // min_interval: the least time between two questions to the coordinator
  // (tests lengthen it to stay clear of a busy machine's scheduling).
  explicit JobGate(uint32_t shard, bool closed = false,
                   std::chrono::milliseconds min_interval = std::chrono::milliseconds(10))
      : shard_(shard), closed_(closed), min_interval_(min_interval) {}
  ~JobGate();
  JobGate(const JobGate&) = delete;
  JobGate& operator=(const JobGate&) = delete;

  // Where the cluster's job is read (the coordinator's map). Without one,
  // the first job seen is served and no other.
  void SetSource(Source source);
  // The job and epoch a rejoining shard serves from now.
  void Open(uint64_t job, uint32_t epoch);

  enum class Verdict {
    kCurrent,   // the message belongs to what the shard serves
    kNewJob,    // a newer job began: start afresh, then admit again
    kRollBack,  // the job rolled back: reload resume_step, then admit again
    kWait,      // ask again at retry_at: the coordinator was asked too recently
  };
  using Clock = std::chrono::steady_clock;
  struct Admission {
    Verdict verdict = Verdict::kCurrent;
    uint64_t resume_step = 0;      // kRollBack: the checkpoint step to reload
    Clock::time_point retry_at{};  // kWait
  };
  // The job and epoch of a message from `worker` that arrived at
  // `received`: what the shard serves; a move to where the coordinator's
  // map stands (the gate has moved; the caller acts on it and admits the
  // message again, which may then be stale); kWait; or an error naming the
  // worker and what is allowed.
  Result<Admission> Admit(uint64_t job, uint32_t epoch, uint32_t worker,
                          Clock::time_point received = Clock::now());

  // False while a rejoining shard waits for its registration (Open).
  bool open() const { return !closed_.load(std::memory_order_acquire); }
  uint64_t job() const { return job_.load(std::memory_order_relaxed); }
  uint32_t epoch() const { return epoch_.load(std::memory_order_relaxed); }

 private:
  // The coordinator's job state, asked again when `job`/`epoch` is newer
  // than what it said last and it was last asked before `received`; null
  // while the question is out or when it was asked less than 10 ms ago
  // (*retry_at: when to look again).
  Result<std::optional<JobState>> Confirm(uint64_t job, uint32_t epoch, Clock::time_point received,
                                          Clock::time_point* retry_at);
  // The question thread: asks the source whenever a question is wanted.
  void AskLoop();

  const uint32_t shard_;
  std::atomic<bool> closed_;
  std::atomic<uint64_t> job_{0};  // 0: none yet
  std::atomic<uint32_t> epoch_{0};
  const std::chrono::milliseconds min_interval_;
  std::mutex mu_;
  std::condition_variable wanted_;  // a question is wanted, or the gate ends
  // Guarded by mu_:
  Source source_;
  JobState confirmed_;                            // the coordinator's state when last asked
  std::optional<Clock::time_point> last_query_;   // when it was last asked
  std::optional<Clock::time_point> last_answer_;  // when the answer in confirmed_ was asked for
  bool asking_ = false;                           // a question is out (or wanted)
  bool stopping_ = false;
  // The last question failed (and was asked at failed_at): the first
  // claim it would judge is refused with it, the others wait for the next.
  std::optional<Status> failure_;
  Clock::time_point failed_at_{};
  std::thread asker_;  // started at the first question
};

}  // namespace gridsync
