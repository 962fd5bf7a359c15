// Training with gradient_sync "hybrid": a collective inside each node and
// the sparse PS across nodes, each where it wins.
//
// Every step, on each node:
//   1. the node's workers share the rows their slices will read (all-gather
//      of row ids) and each local rank pulls, from the PS, the union's rows
//      that fall in its slice of the parameter rows; an all-gather inside the
//      node then gives every worker those fresh values;
//   2. each worker computes the gradient of its share of the global batch;
//   3. a reduce-scatter inside the node sums the gradients, so local rank l
//      holds the node's gradient for its slice of rows;
//   4. each local rank pushes the non-zero rows of its slice to the PS. All
//      local ranks talk to the PS in parallel; the shards sum the nodes'
//      pushes and run Adam (bsp: once every push of the step is in).
// Slices are contiguous ranges of the parameter rows (grid levels, then MLP
// tables), cut at row boundaries into near-equal parts. Nodes may run
// different numbers of workers (distributed.nodes).
//
// Thread safety: reentrant; one call per worker.
#pragma once

#include <functional>

#include "common/config.h"
#include "common/status.h"
#include "worker/collective/collective.h"
#include "worker/collective/factory.h"
#include "worker/image_task.h"
#include "worker/ps_trainer.h"
#include "worker/trainer.h"

namespace gridsync {

struct HybridWorkerOptions {
  PsWorkerOptions ps;
  // Where the intra-node group listens (see AllReduceWorkerOptions).
  CollectiveEndpoint endpoint;
  // The intra-node group of this worker, created once its rank is known. The
  // default builds it with the configured backend through the coordinator's
  // KV store; tests pass in-process groups.
  std::function<Result<Collective*>(PsSession& session, int node, int local_rank, int node_size)> intra_group;
};

Result<TrainReport> TrainImageHybrid(const Config& config, const ImageTask& image,
                                     const HybridWorkerOptions& options);

}  // namespace gridsync
