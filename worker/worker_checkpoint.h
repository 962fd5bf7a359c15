// Checkpoints of a worker's own training state, as part worker-<rank> of a
// step (common/checkpoint_files.h); a resumed worker (gridsync launch
// --resume, --start-step) loads its part before its first step.
//
// Under ps and hybrid: the error-feedback residuals and, with Adam on the
// workers, its m, v and step counts (PsClient::AppendState), written after
// the worker's push of the step before, so that with the shards' partitions
// they are the whole training state at that step.
//
// Under nccl there are no shards: every worker holds the whole model, so
// its part is the model's parameters and its Adam state (the replicated
// optimizer's, or its model_parallel slice's), written after the step's
// update. Each worker writes its own part, so a worker restores exactly
// what it held, whatever slice of Adam that is.
//
// Thread safety: free functions; the client, model and optimizer must not
// change meanwhile.
#pragma once

#include <cstdint>
#include <string>

#include "common/checkpoint_mac_key.h"
#include "common/status.h"
#include "spec/run_spec.h"
#include "worker/local_optimizer.h"
#include "worker/model.h"
#include "worker/ps_client.h"
#include "worker/sync/sharded_update.h"

namespace gridsync {

// `keep`: steps to leave on disk (WriteCheckpointPart), here and below;
// `run`: the run the part belongs to (common/checkpoint_run.h); `key`
// (under CURVE: CheckpointMacKeyFor(config, "worker")), here and below: the
// files carry its MAC, and reads refuse files without one or whose MAC
// differs (ReadCheckpointPart).
Status WriteWorkerCheckpoint(const RunSpec& spec, uint32_t rank, uint32_t shards, uint64_t step,
                             PsClient* ps, const std::vector<uint64_t>& keep = {},
                             const std::string& run = "", const CheckpointMacKey* key = nullptr);

// Whether LoadWorkerCheckpoint's checks of the files would pass (manifest,
// shape, size, checksum), without a client: a worker restarted into a
// running job looks for a step it can load before it registers with it.
Status CheckWorkerCheckpoint(const RunSpec& spec, uint32_t rank, uint32_t shards, uint64_t step,
                             const CheckpointMacKey* key = nullptr);

// Checks the manifest (the same model, partition and codec, size and
// checksum) before replacing the client's state. `run` (unless null)
// receives the run the files name.
Status LoadWorkerCheckpoint(const RunSpec& spec, uint32_t rank, uint32_t shards, uint64_t step,
                            PsClient* ps, std::string* run = nullptr,
                            const CheckpointMacKey* key = nullptr);

// The nccl worker's part. Exactly one of `replicated` and `sharded` is set
// (distributed.model_parallel picks). Load checks the manifest (the same
// tables, worker count, model_parallel and mp_dim, size and checksum) and
// the size against the model and optimizer before reading, then replaces
// the parameters (and their fp16 working copy) and Adam's state. A refusal
// found in the bytes themselves (values training never makes) may come
// after part of them was taken: the caller must not train on after one (a
// worker that cannot resume exits).
struct AllReduceState {
  HashGridModel* model = nullptr;
  LocalOptimizer* replicated = nullptr;
  ShardedUpdate* sharded = nullptr;
};
Status WriteAllReduceCheckpoint(const RunSpec& spec, uint32_t rank, uint32_t workers, uint64_t step,
                                const AllReduceState& state, const std::vector<uint64_t>& keep = {},
                                const CheckpointMacKey* key = nullptr);
Status LoadAllReduceCheckpoint(const RunSpec& spec, uint32_t rank, uint32_t workers, uint64_t step,
                               const AllReduceState& state, const CheckpointMacKey* key = nullptr);

}  // namespace gridsync
