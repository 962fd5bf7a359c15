// Shard memory (shard_memory.h).
#include "spec/shard_memory.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>

#include "common/host_memory.h"

namespace gridsync {

namespace {

// The sum over the tables of `bytes(rows, values)`: a table's rows on this
// shard and the bytes of its values (rows x its columns here).
template <typename Bytes>
uint64_t SumOverTables(const Partition& partition, uint32_t shard, Bytes bytes) {
  uint64_t sum = 0;
  for (uint32_t t = 0; t < partition.n_tables(); ++t) {
    const uint64_t rows = partition.LocalRows(shard, t);
    sum += bytes(rows, rows * partition.ColWidth(t) * sizeof(float));
  }
  return sum;
}

}  // namespace

uint64_t ShardStateBytes(const Partition& partition, uint32_t shard, bool apply_updates,
                         uint32_t replica_workers) {
  // The parameters and each replica worker's copy; with Adam, m, v and
  // the step counts.
  return SumOverTables(partition, shard, [&](uint64_t rows, uint64_t values) {
    return (1 + uint64_t{replica_workers}) * values +
           (apply_updates ? 0 : 2 * values + rows * sizeof(uint32_t));
  });
}

uint64_t ShardMemoryBytes(const Partition& partition, uint32_t shard, bool apply_updates,
                          uint32_t replica_workers) {
  // The state, and the gradients, the touched bits and (updates) the push
  // counts.
  return ShardStateBytes(partition, shard, apply_updates, replica_workers) +
         SumOverTables(partition, shard, [&](uint64_t rows, uint64_t values) {
           return values + (rows + 63) / 64 * sizeof(uint64_t) +
                  (apply_updates ? rows * sizeof(uint32_t) : 0);
         });
}

namespace {

uint32_t ReplicaWorkersOf(const RunSpec& spec) {
  return spec.compression.delta_pulls
             ? static_cast<uint32_t>(std::max(spec.config.distributed.world_size, 0))
             : 0;
}

}  // namespace

uint64_t ShardMemoryBytes(const RunSpec& spec, const Partition& partition, uint32_t shard) {
  return ShardMemoryBytes(partition, shard, spec.sync.optimizer_on_workers, ReplicaWorkersOf(spec));
}

nlohmann::json ShardCheckpointShape(const Partition& partition, uint32_t shard) {
  nlohmann::json shapes = nlohmann::json::array();
  for (uint32_t t = 0; t < partition.n_tables(); ++t) {
    shapes.push_back({partition.LocalRows(shard, t), partition.ColWidth(t)});
  }
  return shapes;
}

uint64_t ShardStateBytes(const RunSpec& spec, const Partition& partition, uint32_t shard) {
  return ShardStateBytes(partition, shard, spec.sync.optimizer_on_workers, ReplicaWorkersOf(spec));
}

uint64_t LargestShardMemoryBytes(const RunSpec& spec) {
  const int shards = spec.config.ps.shards;
  if (shards <= 0) return 0;
  auto partition =
      Partition::Make(spec.model.tables, static_cast<uint32_t>(shards), spec.sync.partition_dim);
  if (!partition.ok()) return 0;
  uint64_t largest = 0;
  for (uint32_t s = 0; s < static_cast<uint32_t>(shards); ++s)
    largest = std::max(largest, ShardMemoryBytes(spec, *partition, s));
  return largest;
}

Status CheckShardMemory(const RunSpec& spec, const Partition& partition, uint32_t shard,
                        uint64_t available) {
  const uint64_t need = ShardMemoryBytes(spec, partition, shard);
  if (available == 0 || need <= available) return Status::OK();
  const auto [needs, has] = NeedAndAvailable(need, available);
  return Status::InvalidArgument(fmt::format(
      "shard {}'s partition needs about {} ({} values of {} tables: parameters, "
      "gradients{}{}) but {} are available; allowed: fewer encoding.n_levels, "
      "n_features_per_level or log2_hashmap_size, or more ps.shards",
      shard, needs, partition.OwnedValues(shard), partition.n_tables(),
      spec.sync.optimizer_on_workers ? "" : ", Adam's m, v and step counts",
      ReplicaWorkersOf(spec) > 0 ? ", a replica per worker (compression.pull)" : "", has));
}

Status CheckShardMemoryOn(const RunSpec& spec, int node, uint64_t available) {
  const auto& shards = spec.config.layout.shards;
  if (shards.empty() || available == 0) return Status::OK();
  GRIDSYNC_ASSIGN_OR_RETURN(const Partition partition,
                            Partition::Make(spec.model.tables, static_cast<uint32_t>(shards.size()),
                                            spec.sync.partition_dim));
  for (uint32_t s = 0; s < shards.size(); ++s) {
    if (node >= 0 && shards[s].node != node) continue;
    GRIDSYNC_RETURN_IF_ERROR(CheckShardMemory(spec, partition, s, available));
  }
  return Status::OK();
}

}  // namespace gridsync
