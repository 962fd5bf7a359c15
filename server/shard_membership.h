// How a shard process joins its cluster through the coordinator:
//   - before serving, whether it rejoins a running job (it was restarted
//     during training) and from which checkpoint step: the newest step every
//     part of the job published (common/checkpoint_registry.h), which this
//     shard must hold in its own checkpoint folder;
//   - after binding, its registration (with that step: the coordinator then
//     moves the job's epoch and every process rolls back to it), and the
//     control the shard asks through from then on.
//
// Thread safety: free functions, called from the shard's main thread.
#pragma once

#include <chrono>
#include <cstdint>

#include "common/cluster_map.h"
#include "common/coordinator_client.h"
#include "common/status.h"
#include "common/store.h"
#include "server/ps_shard.h"
#include "spec/run_spec.h"

namespace gridsync {

// 0: a fresh shard (no checkpoints, training not started, or no step that
// every part holds). An error when the job's step is not in this shard's
// checkpoint folder. `below`: look under this step (its files did not load).
Result<uint64_t> FindRejoinStep(CoordinatorClient& coordinator, const RunSpec& spec, uint32_t shard,
                                uint64_t below = UINT64_MAX);

// Registers `info` (rejoining from `rejoin_step` when > 0), gives `server`
// its control (the coordinator's job state; checkpoint steps published to
// `registry`, which outlives the shard) and, when rejoining, opens it at
// the job and epoch the coordinator admitted it to.
Result<CoordinatorClient::Registration> JoinAsShard(PsShard& server, CoordinatorClient& coordinator,
                                                    Store* registry, RegisterInfo info,
                                                    uint64_t rejoin_step,
                                                    std::chrono::milliseconds timeout);

}  // namespace gridsync
