#include "server/in_process_cluster.h"

#include "server/shard_membership.h"
#include "spec/cluster_settings.h"

namespace gridsync {

Result<std::unique_ptr<InProcessCluster>> InProcessCluster::Start(Config config,
                                                                  int shards_to_start) {
  auto cluster = std::unique_ptr<InProcessCluster>(new InProcessCluster);
  const auto& d = config.distributed;
  CoordinatorOptions co;
  co.expected_shards =
      d.gradient_sync == GradientSyncMode::kNccl ? 0 : static_cast<uint32_t>(config.ps.shards);
  co.expected_workers = static_cast<uint32_t>(d.world_size);
  GRIDSYNC_ASSIGN_OR_RETURN(co.auth, wire::ControlAuthFor(config, "coordinator"));
  GRIDSYNC_ASSIGN_OR_RETURN(cluster->coordinator_, Coordinator::Start(co));
  config.distributed.master_port = cluster->coordinator_->port();
  GRIDSYNC_ASSIGN_OR_RETURN(const RunSpec spec, RunSpec::Resolve(config));
  const auto timeout = spec.sync.timeout;
  const std::vector<TableInfo>& tables = spec.model.tables;
  GRIDSYNC_ASSIGN_OR_RETURN(
      Partition partition,
      Partition::Make(tables, static_cast<uint32_t>(config.ps.shards), spec.sync.partition_dim));
  cluster->partition_ = std::make_unique<Partition>(std::move(partition));
  const int n = shards_to_start < 0 ? config.ps.shards : shards_to_start;
  for (int s = 0; s < n; ++s) {
    GRIDSYNC_ASSIGN_OR_RETURN(ShardOptions options,
                              ShardOptionsFor(spec, static_cast<uint32_t>(s)));
    GRIDSYNC_ASSIGN_OR_RETURN(std::unique_ptr<PsShard> shard,
                              PsShard::Start(*cluster->partition_, options));
    GRIDSYNC_ASSIGN_OR_RETURN(const wire::ControlAuth auth, wire::ControlAuthFor(config, "shard"));
    GRIDSYNC_ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorClient> client,
                              CoordinatorClient::Connect("127.0.0.1", cluster->coordinator_->port(),
                                                         timeout, auth, Role::kShard));
    RegisterInfo info;
    info.role = Role::kShard;
    info.requested_rank = s;
    info.node = "in-process";
    info.endpoint = shard->endpoint();
    info.tables = tables;
    info.shared_settings = SharedSettings(spec);
    // A registry as gridsync-ps has: the checkpoints' steps and run go
    // through the coordinator's store, as the workers' do.
    auto registry = std::make_unique<CoordinatorStore>(client.get());
    GRIDSYNC_RETURN_IF_ERROR(
        JoinAsShard(*shard, *client, registry.get(), info, /*rejoin_step=*/0, timeout).status());
    cluster->shards_.push_back(std::move(shard));
    cluster->registrations_.push_back(std::move(client));
    cluster->registries_.push_back(std::move(registry));
  }
  cluster->config_ = std::move(config);
  return cluster;
}

InProcessCluster::~InProcessCluster() { Stop(); }

std::vector<uint64_t> InProcessCluster::AppliedSteps() const {
  std::vector<uint64_t> out;
  for (const auto& shard : shards_) out.push_back(shard->stats().applied_steps);
  return out;
}

void InProcessCluster::Stop() {
  for (auto& shard : shards_) shard->Stop();
  shards_.clear();
  registries_.clear();
  registrations_.clear();
  if (coordinator_) coordinator_->Stop();
  coordinator_.reset();
}

}  // namespace gridsync
