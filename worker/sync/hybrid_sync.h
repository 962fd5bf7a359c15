// gradient_sync "hybrid": a collective inside each node and the sparse PS
// across nodes, each where it wins. It composes the PS session (ps_session.h)
// with an intra-node Collective. Every step, on each node:
//   1. Prepare: the node's workers share the rows their slices will read
//      (all-gather of row ids) and each local rank pulls, from the PS, the
//      union's rows that fall in its slice of the parameter rows; an
//      all-gather inside the node then gives every worker those values;
//   2. (the loop computes each worker's gradient, in micro-batches);
//   3. Apply: a reduce-scatter inside the node sums the gradients, so local
//      rank l holds the node's gradient for its slice of rows, and each local
//      rank pushes the non-zero rows of its slice. The shards sum the nodes'
//      pushes and run Adam (bsp: once every push of the step is in).
// Slices are contiguous ranges of the parameter rows (row_space.h), cut at
// row boundaries into near-equal parts. Nodes may run different numbers of
// workers (distributed.nodes).
//
// Mixed precision: the node sums an overflow flag with one more all-reduce;
// a node that overflowed pushes flagged empty pushes and the shards apply
// none of the step.
//
// Checkpoints and rollback as in ps (bsp): the shards' state, and the
// workers' own (residuals, worker Adam) when they hold any. A worker or
// shard restarted mid-run rolls the job back (Recover), and the node's
// collective is formed again under the new epoch's keys.
//
// Thread safety: see gradient_sync.h.
#pragma once

#include <memory>
#include <string>

#include "common/store.h"
#include "common/thread_pool.h"
#include "kernels/cpu/hash_encoding.h"
#include "spec/run_spec.h"
#include "worker/collective/collective.h"
#include "worker/collective/factory.h"
#include "worker/sync/gradient_sync.h"
#include "worker/sync/ps_session.h"
#include "worker/sync/row_space.h"

namespace gridsync {

class HybridSync : public PsSessionSync {
 public:
  // Joins the node's intra group: options.intra_group when set, else the
  // configured backend through the coordinator's KV store.
  static Result<std::unique_ptr<HybridSync>> Create(const RunSpec& spec, HashGridModel* model,
                                                    PsSession session, const BatchSource* source,
                                                    const SplitSchedule* split, ThreadPool* pool,
                                                    const WorkerOptions& options);

  Result<const StepBatch*> Prepare(uint64_t step) override;
  Result<SyncOutcome> Apply(uint64_t step, ModelGradients* grads, float loss_scale) override;
  // A process of the job restarted and rejoined from its checkpoint: the
  // job goes back to that step, and this worker with it; the node's
  // collective is formed again (with the restarted worker, if it is one of
  // the node's) under keys of the new epoch. Not with a collective handed
  // in (WorkerOptions::intra_group).
  Result<uint64_t> Recover(const Status& failure) override;

 private:
  HybridSync(const RunSpec& spec, HashGridModel* model, PsSession session,
             const BatchSource* source, const SplitSchedule* split, ThreadPool* pool);
  float* ParamOf(uint64_t global_row);
  // Forms the node's collective through the coordinator's store, as group
  // "intra-<node>" (epoch 0) or "intra-<node>-epoch<e>": every member of a
  // rolled-back job meets under the same new keys.
  Status JoinIntra(uint32_t epoch);
  double CommSeconds() const override { return comm_seconds_; }

  const BatchSource* source_;
  const SplitSchedule* split_;
  ThreadPool* pool_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Collective> owned_intra_;
  Collective* intra_ = nullptr;
  std::string node_name_;
  CollectiveEndpoint endpoint_;  // this worker's, for JoinIntra
  int local_ = 0;
  int node_size_ = 1;
  RowSpace space_;
  std::vector<uint64_t> bounds_;        // slice bounds in global rows, per local rank
  std::vector<size_t> slice_elements_;  // per local rank
  StepBatch batch_;
  cpu::GridBatchLookup lookup_;
  cpu::GridRowSet row_set_;
  std::vector<float> packed_;
  std::vector<float> my_grad_;
  std::vector<uint64_t> needed_bits_;
  double comm_seconds_ = 0;
};

}  // namespace gridsync
