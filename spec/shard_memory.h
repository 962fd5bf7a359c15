// What one PS shard of a run allocates for its partition, and the check
// gridsync-ps makes of it before allocating, which `gridsync check-config`
// and `gridsync launch` make too (a review: check-config counted 3 floats a
// parameter, without the replica per worker delta pulls keep, and the
// shard then refused a size check-config had passed, after launch started
// the coordinator).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "common/sharding.h"
#include "common/status.h"
#include "spec/run_spec.h"

namespace gridsync {

// As a shard's store allocates (server/shard_store.h): parameters and
// gradients, the touched bits, then per-row push counts (`apply_updates`,
// Adam on the workers) or Adam's m, v and step counts, and a copy of the
// parameters per replica worker (delta pulls).
uint64_t ShardMemoryBytes(const Partition& partition, uint32_t shard, bool apply_updates,
                          uint32_t replica_workers);

// The same for shard `shard` of the run `spec` describes.
uint64_t ShardMemoryBytes(const RunSpec& spec, const Partition& partition, uint32_t shard);

// A shard's checkpoint part as its store writes it (server/shard_checkpoint.h,
// ShardStore::StateBytes): the shape, [local rows, width] a table, and the
// .bin's bytes (the parameters and each replica worker's copy, and with
// Adam on the shard its m, v and step counts). gridsync launch --resume
// compares them with the chosen step's manifests before anything starts
// (each shard refused a changed model only at its start, the launcher
// then ending 1).
nlohmann::json ShardCheckpointShape(const Partition& partition, uint32_t shard);
uint64_t ShardStateBytes(const Partition& partition, uint32_t shard, bool apply_updates,
                         uint32_t replica_workers);
uint64_t ShardStateBytes(const RunSpec& spec, const Partition& partition, uint32_t shard);

// The largest shard's bytes; 0 when the run has no shards or its tables do
// not partition (the config's own checks name that).
uint64_t LargestShardMemoryBytes(const RunSpec& spec);

// OK when shard `shard` fits in `available` bytes (0: unknown, OK); else
// InvalidArgument naming its size, what it holds, and what would fit.
Status CheckShardMemory(const RunSpec& spec, const Partition& partition, uint32_t shard,
                        uint64_t available);

// CheckShardMemory of every shard placed on `node` (config.layout; -1: every
// shard, a cluster on one machine), each a process of its own.
Status CheckShardMemoryOn(const RunSpec& spec, int node, uint64_t available);

}  // namespace gridsync
