#include "server/shard_membership.h"

#include <algorithm>
#include <string>

#include "common/checkpoint_registry.h"
#include "server/shard_checkpoint.h"

namespace gridsync {

Result<uint64_t> FindRejoinStep(CoordinatorClient& coordinator, const RunSpec& spec,
                                uint32_t shard) {
  const Config& config = spec.config;
  if (config.checkpoint.every_steps <= 0) return uint64_t{0};
  GRIDSYNC_ASSIGN_OR_RETURN(const ClusterMap map, coordinator.GetMap(/*wait_complete=*/false,
                                                                     std::chrono::milliseconds(0)));
  CoordinatorStore store(&coordinator);
  const uint32_t workers = static_cast<uint32_t>(config.distributed.world_size);
  const auto parts = CheckpointParts(static_cast<uint32_t>(config.ps.shards),
                                     spec.sync.worker_state ? workers : 0);
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t step, NewestCommonStep(store, map.job, parts));
  if (step == 0) return uint64_t{0};
  const auto held = HeldSteps(config.checkpoint.dir, ShardPart(shard));
  if (std::find(held.begin(), held.end(), step) == held.end()) {
    std::string mine;
    for (uint64_t s : held) mine += (mine.empty() ? "" : ", ") + std::to_string(s);
    return Status::NotFound("shard " + std::to_string(shard) + " cannot rejoin job " +
                            std::to_string(map.job) + ": its newest complete checkpoint is step " +
                            std::to_string(step) + ", but " + config.checkpoint.dir +
                            " holds this shard's steps [" + mine +
                            "]; allowed: restart the shard where its checkpoint.dir is");
  }
  return step;
}

Result<CoordinatorClient::Registration> JoinAsShard(PsShard& server, CoordinatorClient& coordinator,
                                                    Store* registry, RegisterInfo info,
                                                    uint64_t rejoin_step,
                                                    std::chrono::milliseconds timeout) {
  info.rejoin_step = rejoin_step;
  GRIDSYNC_ASSIGN_OR_RETURN(auto registered, coordinator.Register(info, timeout));
  CoordinatorClient* client = &coordinator;
  server.SetControl({[client] { return client->CurrentJob(); }, registry});
  if (rejoin_step > 0) server.Rejoined(registered.map.job, registered.map.epoch);
  return registered;
}

}  // namespace gridsync
