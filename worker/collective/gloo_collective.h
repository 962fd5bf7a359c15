// The Gloo backend: collectives between processes over Gloo's TCP transport,
// on float32 buffers in host memory (see collective.h for the semantics).
//
// Rendezvous goes through our Store seam (common/store.h), normally a
// CoordinatorStore backed by the coordinator's KV store, so no shared
// filesystem is needed. Each rank publishes its listening addresses under
// "gloo/<group>/<rank>" and reads everyone else's; a prefix per group lets
// several groups (flat, intra-node, inter-node) coexist in one store. The
// ranks then say in the store how their connections went, check the mesh
// with an all-reduce of nonces, and connect again on fresh ports when any
// rank failed (a stranger that connected to a pair's listener first ended
// the job): gloo_rendezvous.cc. A group
// name must be new for each creation (for example include the cluster map's
// generation): keys are never deleted, and a stale entry would point at a
// process that is gone.
//
// Algorithms: all-reduce is Gloo's ring; all-gather(v), broadcast and
// barrier are Gloo's; reduce-scatter with uneven counts is a ring over
// Gloo's unbound buffers (Debian's libgloo has no options-style
// reduce-scatter). Ring sums are not in rank order, but every rank gets the
// same bits. A sealed group (GlooCollectiveOptions::seal, under
// security.curve) runs every operation as sealed_ring.h's rings instead,
// each message encrypted and authenticated.
//
// Errors: Gloo's exceptions never escape. A rank that does not join within
// the timeout fails creation on the others with Timeout naming the missing
// ranks; a peer that dies or stalls during an operation fails it with
// IOError or Timeout (Gloo's own timeout is set from ours), and the group is
// broken from then on (Gloo closes every pair of the context on a timeout).
//
// Thread safety: see collective.h.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "common/store.h"
#include "worker/collective/collective.h"
#include "worker/collective/collective_seal.h"

namespace gridsync {

struct GlooCollectiveOptions {
  // Bounds the rendezvous and every operation.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // Address this rank listens on and advertises to its peers. The default
  // keeps tests and the local demo on loopback.
  std::string hostname = "127.0.0.1";
  // When set (for example "eth0"), listen on this interface's address
  // instead of `hostname`.
  std::string interface;
  // When set (security.curve), every message is sealed (collective_seal.h)
  // under a key of each formed mesh derived from this one, and the
  // algorithms are sealed_ring.h's instead of Gloo's.
  std::shared_ptr<const CollectiveSeal> seal;
};

// Joins group `group` as `rank` of `size`; blocks until every rank has joined
// and connected, or the timeout. `store` must outlive the call only.
Result<std::unique_ptr<Collective>> NewGlooCollective(Store* store, int rank, int size,
                                                      const std::string& group,
                                                      const GlooCollectiveOptions& options);

}  // namespace gridsync
