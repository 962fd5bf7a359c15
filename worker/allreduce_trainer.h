// Training with gradient_sync "nccl": every worker keeps the whole model,
// computes the gradient of its share of each global batch, and the gradients
// are summed across workers by all-reduce over the Collective seam (NCCL on
// GPUs, Gloo on CPU hosts, LocalCollective in tests), in fixed-order buckets
// with a cross-rank check per bucket. Every worker then runs the same Adam
// step, as DDP does.
//
// Flat: one all-reduce over all workers. Hierarchical (Horovod's scheme): a
// reduce-scatter inside each node, an all-reduce across nodes among the
// local ranks that own the same slice, and an all-gather inside the node.
// Nodes may have different worker counts: the buffer is cut into S slices,
// S = the smallest node's worker count, and local ranks >= S own none.
//
// With a rank-ordered reduction (LocalCollective) and an even split, the
// parameters equal a single process with gradient_accumulation = workers bit
// for bit; Gloo's ring and the hierarchical scheme sum in other orders, so
// they match within float rounding.
//
// Thread safety: reentrant; one call per worker.
#pragma once

#include <functional>

#include "common/config.h"
#include "common/status.h"
#include "worker/collective/collective.h"
#include "worker/collective/factory.h"
#include "worker/image_task.h"
#include "worker/trainer.h"

namespace gridsync {

struct AllReduceGroups {
  Collective* flat = nullptr;   // every worker; always required
  Collective* intra = nullptr;  // hierarchical: the workers of this node
  Collective* inter = nullptr;  // hierarchical: this local rank across nodes (null if it owns no slice)
};

struct AllReduceWorkerOptions {
  TrainOptions train;
  // Where this rank's collectives listen (Gloo) and which device it drives
  // (NCCL): set from the cluster layout by the worker binary.
  CollectiveEndpoint endpoint;
  int throttle_ms = 0;  // test seam: extra compute time per step (a slow worker)
};

Result<TrainReport> TrainImageAllReduce(const Config& config, const ImageTask& image, int rank,
                                        const AllReduceGroups& groups,
                                        const AllReduceWorkerOptions& options);

// The hierarchical sum of `data` (in place) over intra-node then inter-node
// groups, as described above. `slices` = S.
Status HierarchicalAllReduce(Collective& intra, Collective* inter, int slices, float* data, size_t n);

}  // namespace gridsync

namespace gridsync {

// A worker process of a cluster: registers with the coordinator, builds the
// flat (and, for hierarchical, intra- and inter-node) groups through the
// coordinator's KV store with the configured backend, then trains.
Result<TrainReport> TrainImageAllReduceWorker(const Config& config, const ImageTask& image, int rank,
                                              const AllReduceWorkerOptions& options);

}  // namespace gridsync
