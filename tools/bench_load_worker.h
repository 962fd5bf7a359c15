// What the two drivers of gridsync-bench load's simulated workers share
// (bench_load.h): the batches they push and pull, one worker's counters and
// latencies, and the start line. The drivers:
//   - client (bench_load_run.cc): W real PsClients, each on a thread of its
//     own, as W training workers in one process would run them;
//   - events (bench_load_events.cc): W DEALER connections driven as state
//     machines from one thread, their messages written and read by the
//     same wire layer PsClient uses (wire::EncodeCopy, wire::Decode). A
//     load generator: the host's cores go to the shard, as when the
//     workers run on hosts of their own.
// Both run the same iteration (push batch k, then pull batch k + 1) and
// fill the same WorkerStats, so their rows are read alike.
//
// Thread safety: a WorkerStats belongs to the thread that drives its
// worker until that thread is joined; Control is shared (its mutex).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/cluster_map.h"
#include "common/status.h"
#include "common/wire/message.h"
#include "tools/bench_load.h"

namespace gridsync::bench::load {

// A push's row ids and gradients (the pull of the step before asks for the
// same rows).
struct Batch {
  std::vector<uint32_t> rows;
  std::vector<float> grad;
};

// Batch `index` of the pool: args.rows ascending, distinct row ids, in a
// random window walked in gaps of 1..kMaxGap, and nonzero gradients.
Batch MakeBatch(const LoadArgs& args, uint64_t index);

// The batch worker `worker` pushes at `step` (and pulls at step - 1): a
// random pick from the pool, so workers do not move in step.
const Batch& PickBatch(const LoadArgs& args, const std::vector<Batch>& pool, uint32_t worker,
                       uint64_t step);

// One simulated worker's counters and latencies.
struct WorkerStats {
  std::vector<float> push_us, pull_us;       // timed phase
  uint64_t pushes_sent = 0, pulls_sent = 0;  // every phase; sent = attempted
  uint64_t timed_pushes = 0, timed_pulls = 0;
  uint64_t failures = 0;   // pushes or pulls that returned an error (timeouts too)
  uint64_t bad_pulls = 0;  // pull replies that left a pulled value unwritten
  std::string first_error;
};

// Counts a failed push or pull and keeps the first error's text.
void RecordFailure(WorkerStats* w, const Status& s, const char* what);

// A worker gives up after this many failures, so a dead shard does not
// cost timeout after timeout.
constexpr uint64_t kMaxFailures = 3;

// Start line for the workers: each reports ready after its warmup and waits
// (with a deadline) for go; stop ends the timed loops.
struct Control {
  std::mutex mu;
  std::condition_variable cv;
  uint32_t ready = 0;
  bool go = false;
  std::atomic<bool> stop{false};
};

// The events driver, on the calling thread: n workers (ranks 0..n-1) on
// connections of `context` to map's one shard. Each runs args.warmup
// iterations; once all have, control->ready becomes n and the driver waits
// until go (or go_deadline: then every worker records a failure). Timed
// iterations then run until control->stop, and the requests still out are
// awaited (each at most args.timeout_ms), so that what was sent was also
// answered or counted failed. stats->size() must be n.
void RunEventWorkers(const LoadArgs& args, const std::vector<Batch>& pool, const ClusterMap& map,
                     const std::vector<wire::TableShape>& shapes, uint32_t n,
                     zmq::context_t& context, Clock::time_point go_deadline, Control* control,
                     std::vector<WorkerStats>* stats);

}  // namespace gridsync::bench::load
