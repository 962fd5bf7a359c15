#include "worker/batch_split.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/check.h"

namespace gridsync {

std::vector<uint64_t> BatchSplit::Apportion(uint64_t total, const std::vector<double>& weights) {
  const size_t n = weights.size();
  GRIDSYNC_CHECK_GE(total, n);
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<uint64_t> counts(n);
  std::vector<std::pair<double, size_t>> remainders;
  uint64_t dealt = 0;
  for (size_t i = 0; i < n; ++i) {
    const double exact = sum > 0 ? static_cast<double>(total) * weights[i] / sum
                                 : static_cast<double>(total) / static_cast<double>(n);
    counts[i] = std::max<uint64_t>(1, static_cast<uint64_t>(exact));
    dealt += counts[i];
    remainders.push_back({exact - std::floor(exact), i});
  }
  // Largest remainder first, ties to the lower rank, so every worker agrees.
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t k = 0; dealt < total; ++k, ++dealt) ++counts[remainders[k % n].second];
  // The one-sample floor may have dealt too many: take them back from the
  // largest shares.
  // The largest share, ties to the lower rank, each time: a heap, since
  // 65536 one-sample shares took the linear search 75 s.
  if (dealt > total) {
    auto smaller = [&](size_t a, size_t b) {
      return counts[a] != counts[b] ? counts[a] < counts[b] : a > b;
    };
    std::vector<size_t> heap(n);
    std::iota(heap.begin(), heap.end(), size_t{0});
    std::make_heap(heap.begin(), heap.end(), smaller);
    for (; dealt > total; --dealt) {
      std::pop_heap(heap.begin(), heap.end(), smaller);
      --counts[heap.back()];
      std::push_heap(heap.begin(), heap.end(), smaller);
    }
  }
  return counts;
}

BatchSplit::BatchSplit(const DistributedConfig& distributed, int batch_size)
    : batch_(static_cast<uint64_t>(batch_size)) {
  const int workers = distributed.world_size;
  std::vector<double> weights(static_cast<size_t>(workers), 1.0);
  if (distributed.batch_splitting == BatchSplitting::kWeighted) {
    // Ranks are dealt to the nodes in order (DistributedConfig::NodeOf),
    // walked here once rather than looked up per rank.
    size_t r = 0;
    for (const auto& node : distributed.ResolvedNodes()) {
      for (int k = 0; k < node.workers && r < weights.size(); ++k, ++r) {
        weights[r] = node.weight / node.workers;
      }
    }
  }
  SetCounts(Apportion(batch_, weights));
}

void BatchSplit::SetCounts(std::vector<uint64_t> counts) {
  counts_ = std::move(counts);
  begins_.assign(counts_.size(), 0);
  for (size_t r = 1; r < counts_.size(); ++r) begins_[r] = begins_[r - 1] + counts_[r - 1];
}

bool BatchSplit::Rebalance(const std::vector<double>& samples_per_second) {
  GRIDSYNC_CHECK_EQ(samples_per_second.size(), counts_.size());
  std::vector<double> weights = samples_per_second;
  for (double& w : weights) w = std::max(w, 1e-9);
  auto counts = Apportion(batch_, weights);
  if (counts == counts_) return false;
  SetCounts(std::move(counts));
  return true;
}

}  // namespace gridsync
