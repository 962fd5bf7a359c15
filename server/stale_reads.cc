#include "server/stale_reads.h"

#include <algorithm>
#include <cmath>

#include "server/ps_shard.h"

namespace gridsync {

AdamHyper PerPushHyper(const ShardOptions& options) {
  AdamHyper hyper = options.hyper;
  if (options.consistency == Consistency::kBsp || options.workers <= 1) return hyper;
  // Per-row step counts count pushes, so bias correction follows these betas.
  const double per_round = 1.0 / static_cast<double>(options.workers);
  hyper.beta1 = static_cast<float>(std::pow(static_cast<double>(hyper.beta1), per_round));
  hyper.beta2 = static_cast<float>(std::pow(static_cast<double>(hyper.beta2), per_round));
  return hyper;
}

StaleReads::StaleReads(const ShardOptions& options)
    : workers_(options.workers),
      consistency_(options.consistency),
      staleness_(options.staleness),
      apply_updates_(options.apply_updates) {
  Reset();
}

void StaleReads::Reset() {
  pushes_applied_ = 0;
  read_at_.assign(workers_, 0);
  landed_.assign(workers_, workers_ > 0 ? static_cast<float>(workers_) - 1.0f : 0.0f);
}

void StaleReads::OnPush(const wire::Message& m) {
  if (m.worker_rank >= read_at_.size()) return;
  const float landed = static_cast<float>(pushes_applied_ - read_at_[m.worker_rank]);
  landed_[m.worker_rank] += (landed - landed_[m.worker_rank]) / 16.0f;
  if (!m.skip_step) ++pushes_applied_;
}

float StaleReads::OnPull(const wire::Message& m, const std::vector<uint64_t>& clock) {
  if (m.whole_values || m.worker_rank >= read_at_.size()) return 0.0f;
  // A training read: the pushes landing from now on are the ones its
  // gradient will lack.
  const float landed = landed_[m.worker_rank];
  read_at_[m.worker_rank] = pushes_applied_;
  if (apply_updates_ || consistency_ == Consistency::kBsp || m.worker_rank >= clock.size())
    return 0.0f;
  // Pushes before this worker's push of m.step lands: its own steps not
  // pushed yet (at most the staleness bound + 1), and the other workers'
  // that landed, on average, between its earlier reads and pushes. Each
  // push is an Adam step at learning rate / workers (the shard's lr
  // scale), so in steps at the full rate that is pushes / workers.
  const uint64_t own = m.step > clock[m.worker_rank] ? m.step - clock[m.worker_rank] : 0;
  const uint64_t bound = uint64_t{staleness_} + 1;
  const float pushes = static_cast<float>(std::min(own, bound)) + landed;
  return pushes / static_cast<float>(workers_);
}

}  // namespace gridsync
