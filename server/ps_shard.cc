// The parameter-server shard (server/ps_shard.h): starting one, and the
// options a run specification gives it. The engine is ps_shard_engine.h.
//
// Thread safety: see server/ps_shard.h.
#include "server/ps_shard.h"

#include <algorithm>

#include "server/ps_shard_engine.h"
#include "spec/shard_memory.h"

namespace gridsync {

Result<std::unique_ptr<PsShard>> PsShard::Start(const Partition& partition,
                                                const ShardOptions& options) {
  auto shard = std::make_unique<ps_shard_engine::PsShardImpl>(partition, options);
  GRIDSYNC_RETURN_IF_ERROR(shard->Bind());
  return std::unique_ptr<PsShard>(std::move(shard));
}

uint32_t ReplicaWorkers(const ShardOptions& options) {
  return options.pull_codec.codec != Codec::kNone ? options.workers : 0;
}

uint64_t ShardStoreBytes(const Partition& partition, const ShardOptions& options) {
  return ShardMemoryBytes(partition, options.shard, options.apply_updates, ReplicaWorkers(options));
}

wire::ConnectionLimits ShardConnectionLimits(uint32_t workers) {
  wire::ConnectionLimits limits;
  const uint64_t w = workers;
  limits.max_connections = static_cast<uint32_t>(
      std::max<uint64_t>(limits.max_connections, std::min<uint64_t>(4 * w + 64, UINT32_MAX)));
  limits.max_connections_per_address = static_cast<uint32_t>(std::max<uint64_t>(
      limits.max_connections_per_address, std::min<uint64_t>(2 * w + 16, UINT32_MAX)));
  return limits;
}

Result<ShardOptions> ShardOptionsFor(const RunSpec& spec, uint32_t shard) {
  const Config& config = spec.config;
  ShardOptions options;
  options.shard = shard;
  options.workers = static_cast<uint32_t>(config.distributed.world_size);
  options.consistency = config.ps.consistency;
  options.staleness = static_cast<uint32_t>(config.ps.staleness);
  options.threads = config.ps.threads;
  options.hyper = spec.model.adam;
  options.apply_updates = spec.sync.optimizer_on_workers;
  options.timeout = spec.sync.timeout;
  options.connections = ShardConnectionLimits(options.workers);
  GRIDSYNC_ASSIGN_OR_RETURN(options.curve, wire::CurveSettingsFor(config, "shard"));
  options.checkpoint_every = static_cast<uint64_t>(config.checkpoint.every_steps);
  options.checkpoint_dir = config.checkpoint.dir;
  GRIDSYNC_ASSIGN_OR_RETURN(options.checkpoint_key, wire::CheckpointMacKeyFor(config, "shard"));
  options.checkpoint_parts = CheckpointParts(
      static_cast<uint32_t>(config.ps.shards),
      spec.sync.worker_state ? static_cast<uint32_t>(config.distributed.world_size) : 0);
  if (spec.compression.delta_pulls) {
    options.pull_codec = spec.compression.codec;
    options.pull_min_bytes = spec.compression.min_bytes;
  }
  return options;
}

}  // namespace gridsync
