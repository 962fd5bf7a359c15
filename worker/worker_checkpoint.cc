#include "worker/worker_checkpoint.h"

#include <nlohmann/json.hpp>

#include "common/checkpoint_files.h"

namespace gridsync {
namespace {

std::string Part(uint32_t rank) { return "worker-" + std::to_string(rank); }

// What the state depends on: the tables, how the shards cut them (residual
// keys name column slices), where Adam runs and the codec.
nlohmann::json Shape(const RunSpec& spec, uint32_t shards) {
  nlohmann::json tables = nlohmann::json::array();
  for (const auto& t : spec.model.tables) tables.push_back({t.rows, t.width});
  return {{"tables", tables},
          {"shards", shards},
          {"partition", ToString(spec.sync.partition_dim)},
          {"optimizer", spec.sync.optimizer_on_workers ? "worker" : "shard"},
          {"codec", spec.config.compression.codec}};
}

}  // namespace

Status WriteWorkerCheckpoint(const RunSpec& spec, uint32_t rank, uint32_t shards, uint64_t step,
                             PsClient* ps) {
  std::string data;
  GRIDSYNC_RETURN_IF_ERROR(ps->AppendState(&data));
  return WriteCheckpointPart(spec.config.checkpoint.dir, step, Part(rank), data,
                             Shape(spec, shards));
}

Status LoadWorkerCheckpoint(const RunSpec& spec, uint32_t rank, uint32_t shards, uint64_t step,
                            PsClient* ps) {
  const std::string& dir = spec.config.checkpoint.dir;
  // No state size to check against: the residuals' rows, and which tables
  // Adam stepped, vary with training. RestoreState checks what it takes.
  GRIDSYNC_ASSIGN_OR_RETURN(const std::string data,
                            ReadCheckpointPart(dir, step, Part(rank), Shape(spec, shards)));
  return ps->RestoreState(data, step)
      .WithContext(dir + "/step-" + std::to_string(step) + "/" + Part(rank) + ".bin");
}

}  // namespace gridsync
