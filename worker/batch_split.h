// How a global batch of B samples is divided among W workers
// (distributed.batch_splitting). The global batch never changes; only each
// worker's share does. Worker r takes the contiguous sample range
// [begin(r), end(r)) of the step's global batch, so the union over workers is
// always samples 0..B-1, and gradients (each scaled by 1/B) sum to the
// single-process gradient whatever the split.
//
//   even     - B/W each (the first B mod W workers take one more).
//   weighted - node n gets B * w_n / sum(w) (distributed.nodes[].weight),
//              split evenly among its workers.
//   adaptive - starts even; Rebalance() re-splits in proportion to each
//              worker's measured samples per second, so slow and fast
//              workers finish a step together.
// Shares are rounded by largest remainder and every worker keeps >= 1 sample.
//
// Thread safety: a plain value; every worker computes the same split from
// the same inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"

namespace gridsync {

class BatchSplit {
 public:
  BatchSplit(const DistributedConfig& distributed, int batch_size);

  uint64_t begin(int rank) const { return begins_[static_cast<size_t>(rank)]; }
  uint64_t count(int rank) const { return counts_[static_cast<size_t>(rank)]; }
  const std::vector<uint64_t>& counts() const { return counts_; }

  // Adaptive splitting: samples per second each worker measured over the
  // last interval (the same vector on every worker). Returns whether the
  // split changed.
  bool Rebalance(const std::vector<double>& samples_per_second);

  // Shares proportional to `weights`, summing to `total`, each >= 1.
  static std::vector<uint64_t> Apportion(uint64_t total, const std::vector<double>& weights);

 private:
  void SetCounts(std::vector<uint64_t> counts);

  uint64_t batch_;
  std::vector<uint64_t> counts_;
  std::vector<uint64_t> begins_;
};

}  // namespace gridsync
