#include "worker/sync/peer_watch.h"

#include <string>

namespace gridsync {
namespace {

std::string Missing(const std::vector<MemberInfo>& present, uint32_t expected, const char* role) {
  std::vector<bool> seen(expected, false);
  for (const auto& m : present) {
    if (m.rank < expected) seen[m.rank] = true;
  }
  std::string missing;
  for (uint32_t r = 0; r < expected; ++r) {
    if (!seen[r])
      missing += (missing.empty() ? "" : ", ") + std::string(role) + "-" + std::to_string(r);
  }
  return missing;
}

}  // namespace

Status CheckClusterPeers(CoordinatorClient& coordinator, uint32_t epoch) {
  auto map = coordinator.GetMap(/*wait_complete=*/false, std::chrono::milliseconds(0));
  if (!map.ok()) {
    return Status::Unavailable("the coordinator does not answer: " + map.status().message());
  }
  if (map->epoch != epoch) {
    return Status::IOError("the job rolled back to step " + std::to_string(map->resume_step) +
                           " (epoch " + std::to_string(map->epoch) +
                           "; this worker followed epoch " + std::to_string(epoch) + ")");
  }
  if (map->complete()) return Status::OK();
  std::string missing = Missing(map->workers, map->expected_workers, "worker");
  const std::string shards = Missing(map->shards, map->expected_shards, "shard");
  if (!shards.empty()) missing += (missing.empty() ? "" : ", ") + shards;
  return Status::IOError("the job lost " + missing + " (cluster map generation " +
                         std::to_string(map->generation) +
                         "); a shard restarted with checkpoints rejoins the job, otherwise "
                         "every process of the job must be restarted (gridsync launch --resume)");
}

}  // namespace gridsync
