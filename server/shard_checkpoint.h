// Checkpoints of PS shards: each shard writes its partition (parameters,
// Adam's m and v, per-row step counts) every checkpoint.every_steps applied
// steps, and a restarted job loads them (gridsync launch --resume).
//
// Layout: <dir>/step-<s>/shard-<i>.bin and shard-<i>.json (the manifest:
// step, shard, table shapes, byte count, FNV-1a 64 checksum of the .bin).
// Each file is written atomically (temporary file, fsync, rename, fsync of
// the folder), the manifest after the data, so a crash mid-write leaves a
// .tmp file and no manifest: that step is incomplete and the previous one
// stays in use. The job's checkpoint at step s is complete when every
// shard's manifest for s exists; LatestCompleteCheckpoint finds it. Each
// shard keeps its two newest checkpoints.
//
// Thread safety: free functions; the store must not change meanwhile.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "server/shard_store.h"

namespace gridsync {

Status WriteShardCheckpoint(const std::string& dir, uint32_t shard, uint64_t step,
                            const ShardStore& store);
// Loads step `step` of shard `shard` into `store`, after checking the
// manifest: step, shard, table shapes, size and checksum.
Status LoadShardCheckpoint(const std::string& dir, uint32_t shard, uint64_t step,
                           ShardStore* store);
// The newest step with a manifest from every one of `shards` shards; 0: none.
uint64_t LatestCompleteCheckpoint(const std::string& dir, uint32_t shards);

}  // namespace gridsync
