// Checkpoints of PS shards: each shard writes its partition (parameters,
// Adam's m and v, per-row step counts) every checkpoint.every_steps applied
// steps, and a restarted job loads them (gridsync launch --resume).
//
// Files: part shard-<i> of each step (common/checkpoint_files.h: atomic
// writes, a manifest with the table shapes and a checksum, the two newest
// steps kept). Workers with state of their own write part worker-<r> of the
// same steps (worker/worker_checkpoint.h).
//
// Thread safety: free functions; the store must not change meanwhile.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "server/shard_store.h"

namespace gridsync {

Status WriteShardCheckpoint(const std::string& dir, uint32_t shard, uint64_t step,
                            const ShardStore& store);
// Loads step `step` of shard `shard` into `store`, after checking the
// manifest: step, shard, table shapes, size and checksum.
Status LoadShardCheckpoint(const std::string& dir, uint32_t shard, uint64_t step,
                           ShardStore* store);
// The parts a job's checkpoint step needs: every shard, and every worker
// when the workers hold training state (RunSpec::sync.worker_state); for
// LatestCompleteStep.
std::vector<std::string> CheckpointParts(uint32_t shards, uint32_t workers_with_state);

}  // namespace gridsync
