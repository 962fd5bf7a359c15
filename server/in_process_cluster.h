// A coordinator and PS shards running inside this process, built from a
// config exactly as the gridsync-coordinator and gridsync-ps binaries build
// them (each shard registered through its own coordinator connection). For
// tests and benchmarks that drive workers as threads.
//
// Thread safety: Start/Stop from one thread; the components run their own
// threads; accessors are safe while the cluster runs.
#pragma once

#include <memory>
#include <vector>

#include "common/config.h"
#include "common/coordinator_client.h"
#include "common/sharding.h"
#include "common/status.h"
#include "server/coordinator.h"
#include "server/ps_shard.h"

namespace gridsync {

class InProcessCluster {
 public:
  // Starts the coordinator on a free port (config().distributed.master_port
  // is set to it) and `shards_to_start` shards (-1: ps.shards); fewer than
  // ps.shards leaves the cluster incomplete, as a shard that never started.
  static Result<std::unique_ptr<InProcessCluster>> Start(Config config, int shards_to_start = -1);
  ~InProcessCluster();

  const Config& config() const { return config_; }
  const Partition& partition() const { return *partition_; }
  size_t n_shards() const { return shards_.size(); }
  PsShard& shard(size_t i) { return *shards_[i]; }
  std::vector<uint64_t> AppliedSteps() const;
  void Stop();

 private:
  InProcessCluster() = default;

  Config config_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<Partition> partition_;  // shards refer to it
  std::vector<std::unique_ptr<PsShard>> shards_;
  std::vector<std::unique_ptr<CoordinatorClient>>
      registrations_;  // a shard's membership lasts as its connection
  std::vector<std::unique_ptr<CoordinatorStore>> registries_;  // each shard's checkpoint registry
};

}  // namespace gridsync
