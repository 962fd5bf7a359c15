// What the Gloo backend's two files share (worker/collective/): the
// collective over a connected Gloo context (gloo_collective.cc) and the
// rendezvous that connects it (gloo_rendezvous.cc). Not for other callers:
// NewGlooCollective (gloo_collective.h) is the backend's entry point.
//
// Thread safety: MakeGlooCollective's result as collective.h says; the
// others are safe from any thread.
#pragma once

#include <gloo/context.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "worker/collective/collective.h"
#include "worker/collective/collective_seal.h"

namespace gridsync::gloo_internal {

// The collective `rank` of `size` runs over `context`, every operation
// bounded by `timeout`; with `seal`, over sealed messages (sealed_ring.h).
std::unique_ptr<Collective> MakeGlooCollective(int rank, int size, std::string group,
                                               std::chrono::milliseconds timeout,
                                               std::shared_ptr<gloo::Context> context,
                                               const CollectiveSeal* seal = nullptr);

// The Gloo exception in flight as a Status prefixed by `what`: Timeout for
// a wait that timed out, IOError for the transport's other failures.
Status StatusFromCurrentException(const std::string& what);

// SIGPIPE ignored process-wide, once, before the first Gloo socket exists.
void IgnoreSigpipe();

}  // namespace gridsync::gloo_internal
