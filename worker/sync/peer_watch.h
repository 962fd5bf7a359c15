// Liveness of a job's peers, checked between steps through the
// coordinator's cluster map: a worker or shard that left (its control
// connection closed: crash, kill, host down) or a coordinator that is gone
// fails the step loop at once with their names, in every consistency mode,
// rather than when a barrier or reply times out (or, under async, only at
// the end of training).
//
// Thread safety: uses the CoordinatorClient, which serialises calls.
#pragma once

#include "common/coordinator_client.h"
#include "common/status.h"

namespace gridsync {

// OK while the map is complete and at `epoch`; otherwise an error naming
// who is missing, or the step the job rolled back to.
Status CheckClusterPeers(CoordinatorClient& coordinator, uint32_t epoch = 0);

}  // namespace gridsync
