// Checkpoints of a worker's own training state: the error-feedback residuals
// and, with Adam on the workers, its m, v and step counts (PsClient::
// AppendState). Written as part worker-<rank> of the same steps the shards
// checkpoint (common/checkpoint_files.h), after the worker's push of the
// step before, so that with the shards' partitions they are the whole
// training state at that step; a resumed worker (gridsync launch --resume,
// --start-step) loads its part before its first step.
//
// Thread safety: free functions; the client must not change meanwhile.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "spec/run_spec.h"
#include "worker/ps_client.h"

namespace gridsync {

Status WriteWorkerCheckpoint(const RunSpec& spec, uint32_t rank, uint32_t shards, uint64_t step,
                             PsClient* ps);

// Checks the manifest (the same model, partition and codec, size and
// checksum) before replacing the client's state.
Status LoadWorkerCheckpoint(const RunSpec& spec, uint32_t rank, uint32_t shards, uint64_t step,
                            PsClient* ps);

}  // namespace gridsync
