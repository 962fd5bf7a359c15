// Where a worker process runs in its cluster: its rank (--rank, or the
// launcher's GRIDSYNC_RANK), its node, the address its collectives bind and
// advertise (common/host_address.h's order), and the GPU it drives.
//
// The collectives follow the address: Gloo listens on it, and NCCL is told
// the interface that holds it (NCCL_SOCKET_IFNAME, unless the operator set
// one). Each rank drives the GPU of its local rank, counted among the
// devices CUDA_VISIBLE_DEVICES leaves visible (CUDA applies that mask).
//
// Thread safety: PlaceWorker sets environment variables; call it from main
// before other threads start.
#pragma once

#include <string>
#include <string_view>

#include "common/config.h"
#include "common/status.h"
#include "worker/collective/factory.h"

namespace gridsync {

struct WorkerPlacement {
  std::string node;     // distributed.nodes[].name
  int local_rank = -1;  // -1: the rank is left to the coordinator
  CollectiveEndpoint endpoint;
  std::string host_source;  // where the address came from, for the log
};

// *rank: the --rank flag (-1 if absent), replaced by GRIDSYNC_RANK when the
// flag is absent, or by the node's first rank + GRIDSYNC_LOCAL_RANK when
// only that is set (systemd's gridsync-worker@<local rank>). node_name:
// --node, else GRIDSYNC_NODE ("" if neither). Refuses a rank outside
// the world, a node the config does not name, a rank on another node than
// --node, and (multi-host) a worker that cannot tell its node.
Result<WorkerPlacement> PlaceWorker(const Config& config, int* rank, std::string_view node_name,
                                    std::string_view host_flag);

}  // namespace gridsync
