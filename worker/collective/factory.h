// MakeCollective: creates a collective backend by name, the way the worker
// and the sync strategies ask for one ("auto", "gloo" or "nccl").
//
// "auto" picks NCCL when this build has NCCL and a CUDA device is present,
// otherwise Gloo. Every rank of a group must resolve to the same backend
// (homogeneous hosts); a rank that picks the other one never joins, and the
// others fail at rendezvous with a timeout naming it.
//
// Thread safety: MakeCollective may be called from any thread; see
// collective.h for the returned object.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/store.h"
#include "worker/collective/collective.h"
#include "worker/collective/collective_seal.h"

namespace gridsync {

// Where this rank communicates from. The defaults keep everything on one
// host's loopback (tests, the local demo).
struct CollectiveEndpoint {
  std::string hostname = "127.0.0.1";  // Gloo: address to listen on and advertise
  std::string interface;               // Gloo: listen on this interface instead (e.g. "eth0")
  int cuda_device = -1;                // NCCL: device of this rank; -1: the current device
  // Gloo: seal every message (security.curve; collective_seal.h). NCCL
  // cannot: its traffic stays as NCCL sends it (check-config says so).
  std::shared_ptr<const CollectiveSeal> seal;
};

// "gloo" or "nccl": what `kind` resolves to on this host; InvalidArgument for
// an unknown kind; Unsupported for "nccl" when it cannot run here (the
// message says why).
Result<std::string> ResolveCollectiveKind(std::string_view kind);

// Joins `group` as `rank` of `size` through `store` (rendezvous; typically a
// CoordinatorStore). Blocks until every rank has joined, or `timeout`, which
// also bounds every later operation.
Result<std::unique_ptr<Collective>> MakeCollective(std::string_view kind, Store* store, int rank,
                                                   int size, const std::string& group,
                                                   std::chrono::milliseconds timeout,
                                                   const CollectiveEndpoint& endpoint = {});

}  // namespace gridsync
