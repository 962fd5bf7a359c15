#include "server/shard_membership.h"

#include <algorithm>
#include <string>

#include "common/checkpoint_registry.h"
#include "server/shard_checkpoint.h"

namespace gridsync {

Result<uint64_t> FindRejoinStep(CoordinatorClient& coordinator, const RunSpec& spec, uint32_t shard,
                                uint64_t below) {
  const Config& config = spec.config;
  if (config.checkpoint.every_steps <= 0) return uint64_t{0};
  GRIDSYNC_ASSIGN_OR_RETURN(const ClusterMap map, coordinator.GetMap(/*wait_complete=*/false,
                                                                     std::chrono::milliseconds(0)));
  CoordinatorStore store(&coordinator);
  const uint32_t workers = static_cast<uint32_t>(config.distributed.world_size);
  const auto parts = CheckpointParts(static_cast<uint32_t>(config.ps.shards),
                                     spec.sync.worker_state ? workers : 0);
  return RejoinStep(store, map.job, parts, config.checkpoint.dir, ShardPart(shard), below);
}

Result<CoordinatorClient::Registration> JoinAsShard(PsShard& server, CoordinatorClient& coordinator,
                                                    Store* registry, RegisterInfo info,
                                                    uint64_t rejoin_step,
                                                    std::chrono::milliseconds timeout) {
  info.rejoin_step = rejoin_step;
  GRIDSYNC_ASSIGN_OR_RETURN(auto registered, rejoin_step > 0
                                                 ? coordinator.RegisterAgain(info, timeout)
                                                 : coordinator.Register(info, timeout));
  CoordinatorClient* client = &coordinator;
  server.SetControl({[client] { return client->CurrentJob(); }, registry});
  server.Joined(registered.map.job, registered.map.epoch);
  return registered;
}

}  // namespace gridsync
