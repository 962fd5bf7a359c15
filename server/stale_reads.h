// ssp and async on a shard: each worker's push is its own Adam step, while
// the workers compute from reads that lack the pushes landing meanwhile.
// This keeps what that needs:
//   - PerPushHyper: Adam's betas per push, beta^(1/workers), so a round of
//     pushes decays m and v as one bsp step does;
//   - the look-ahead of a stale read (DANA, Hakimi et al. 2019): how many
//     full-rate Adam steps the parameters will move before the read's
//     gradient lands, from the pushes that really landed between each
//     worker's earlier reads and pushes.
// Measured on configs/local.json (2 workers, 500 steps): per-push betas of
// 0.9/0.99 made m forget in 5 rounds and v in 50 what bsp keeps for 10 and
// 100 steps, and loss spikes (a step above 3x the median of the 10 before)
// came 35-47 times a run instead of 7-9; half of the pushes land with no
// other push between read and push and half with one, where the look-ahead
// used to assume one from every other worker.
//
// Thread safety: the shard's I/O thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "common/wire/message.h"
#include "kernels/adam_math.h"
#include "spec/run_spec.h"

namespace gridsync {

struct ShardOptions;

// The Adam the shard runs: options.hyper under bsp (or one worker), betas
// per push under ssp and async.
AdamHyper PerPushHyper(const ShardOptions& options);

class StaleReads {
 public:
  explicit StaleReads(const ShardOptions& options);

  // A new job, or a fresh shard: one push of every other worker assumed.
  void Reset();
  // A push about to be applied: the pushes that landed since its worker's
  // last read (a skipped step counts none of its own).
  void OnPush(const wire::Message& push);
  // A pull: its look-ahead in full-rate Adam steps (0 for exact reads, bsp,
  // and shards without Adam), given the pushes each worker made so far
  // (`clock`). A training read also starts the count of pushes its
  // gradient will lack.
  float OnPull(const wire::Message& pull, const std::vector<uint64_t>& clock);

 private:
  const uint32_t workers_;
  const Consistency consistency_;
  const uint32_t staleness_;
  const bool apply_updates_;
  uint64_t pushes_applied_ = 0;    // pushes applied (not skipped) so far
  std::vector<uint64_t> read_at_;  // per worker: pushes_applied_ at its last training read
  std::vector<float> landed_;      // per worker: pushes landing between read and push (mean)
};

}  // namespace gridsync
