#include "server/shard_checkpoint.h"

#include <nlohmann/json.hpp>

#include "common/checkpoint_files.h"

namespace gridsync {
namespace {

std::string Part(uint32_t shard) { return "shard-" + std::to_string(shard); }

nlohmann::json Shapes(const ShardStore& store) {
  nlohmann::json shapes = nlohmann::json::array();
  for (uint32_t t = 0; t < store.n_tables(); ++t) {
    shapes.push_back({store.table_rows(t), store.table_width(t)});
  }
  return shapes;
}

}  // namespace

Status WriteShardCheckpoint(const std::string& dir, uint32_t shard, uint64_t step,
                            const ShardStore& store) {
  std::string data;
  store.AppendState(&data);
  return WriteCheckpointPart(dir, step, Part(shard), data, Shapes(store));
}

Status LoadShardCheckpoint(const std::string& dir, uint32_t shard, uint64_t step,
                           ShardStore* store) {
  GRIDSYNC_ASSIGN_OR_RETURN(const std::string data,
                            ReadCheckpointPart(dir, step, Part(shard), Shapes(*store)));
  return store->RestoreState(data).WithContext(dir + "/step-" + std::to_string(step) + "/" +
                                               Part(shard) + ".bin");
}

std::vector<std::string> CheckpointParts(uint32_t shards, uint32_t workers_with_state) {
  std::vector<std::string> parts;
  for (uint32_t s = 0; s < shards; ++s) parts.push_back(Part(s));
  for (uint32_t w = 0; w < workers_with_state; ++w) parts.push_back("worker-" + std::to_string(w));
  return parts;
}

}  // namespace gridsync
