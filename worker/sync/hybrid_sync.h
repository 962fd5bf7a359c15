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
// workers (distributed.nodes). Only the rows the node reads in this step
// (its Prepare) can have a gradient, so the reduce-scatter carries those
// rows alone (and the MLP's), packed in row order: a worker's share of a
// step is its slice's rows of that union, not the whole grid.
//
// With the model on a GPU (SumOnDevice, DeviceStagedSync), the node's sum
// runs where the gradients are: the trainer packs the union's
// gradient rows and the MLP's (device memory for NCCL, pinned host memory
// for a collective that reads host memory), the reduce-scatter sums them,
// and the slice's grid rows go back into the trainer's gradient, where the
// PS client's DevicePushSource encodes the push before the copy (as in ps
// with a codec; without one it copies out the slice's rows with a
// gradient). Only those and the slice's MLP values come to the host. The pending updates of
// worker Adam with error feedback (residuals kept on the device) join the
// slice's pulled rows on the device before the node shares them.
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
#include "kernels/cuda/device_trainer.h"
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
  // backend `collective` ("gloo" or "nccl", the job's agreed choice)
  // through the coordinator's KV store.
  static Result<std::unique_ptr<HybridSync>> Create(const RunSpec& spec, HashGridModel* model,
                                                    PsSession session, const BatchSource* source,
                                                    const SplitSchedule* split, ThreadPool* pool,
                                                    const WorkerOptions& options,
                                                    std::string collective);

  Result<const StepBatch*> Prepare(uint64_t step) override;
  Result<SyncOutcome> Apply(uint64_t step, ModelGradients* grads, float loss_scale) override;
  // A process of the job restarted and rejoined from its checkpoint: the
  // job goes back to that step, and this worker with it; the node's
  // collective is formed again (with the restarted worker, if it is one of
  // the node's) under keys of the new epoch. Not with a collective handed
  // in (WorkerOptions::intra_group).
  Result<uint64_t> Recover(const Status& failure) override;
  // The node's sum on `trainer`'s gradients (see above), from the next
  // step on: Apply then expects ModelGradients::sums_on_device. Null: on
  // the host again.
  void SumOnDevice(cuda::DeviceTrainer* trainer) { device_ = trainer; }

 private:
  HybridSync(const RunSpec& spec, HashGridModel* model, PsSession session,
             const BatchSource* source, const SplitSchedule* split, ThreadPool* pool);
  // The parameter row of `global_row`, which lies in table `t`.
  float* ParamOf(uint32_t t, uint64_t global_row);
  // The gradient row of `global_row`, which lies in table `t`.
  const float* GradientOf(const ModelGradients& grads, uint32_t t, uint64_t global_row) const;
  // The node's sum on the device (SumOnDevice): the union's rows packed by
  // the trainer, reduce-scattered, and the slice's grid rows left there for
  // the push. *mlp_values receives the slice's MLP part (host).
  Result<bool> SumOnTheDevice(bool mixed, std::vector<float>* mlp_values);
  // Pushes `rows` of this worker's slice (their sums at the loss scale,
  // row by row in `values`) whose gradient is not all zero, unscaled in
  // place, with `push`'s refs (the device path's grid rows).
  Status PushSlice(uint64_t step, std::span<const uint64_t> rows, float* values, float unscale,
                   std::vector<TableRowsRef> push);
  // With the residuals on the device: the pending updates join the slice's
  // grid rows in `values` (laid out as slice_rows_[local_]) before the node
  // shares them.
  Status AddDevicePendingUpdates(float* values);
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
  std::string collective_;       // the backend, for JoinIntra
  int local_ = 0;
  int node_size_ = 1;
  RowSpace space_;
  std::vector<uint64_t> bounds_;  // slice bounds in global rows, per local rank
  StepBatch batch_;
  cpu::GridBatchLookup lookup_;
  cpu::GridRowSet row_set_;
  // The prepared step's union of rows the node reads, per local rank's
  // slice (global rows, ascending, the MLP's included), and the floats of
  // each slice's rows: the reduce-scatter's counts.
  std::vector<std::vector<uint64_t>> slice_rows_;
  std::vector<size_t> value_counts_;
  // The union's grid rows (global ids, ascending) and where each slice's
  // start among them (node_size_ + 1 entries): the device path's.
  std::vector<uint32_t> node_grid_rows_;
  std::vector<size_t> node_grid_begin_;
  cuda::DeviceTrainer* device_ = nullptr;
  std::vector<float> packed_;
  std::vector<float> my_grad_;
  std::vector<uint64_t> needed_bits_;
  double comm_seconds_ = 0;
};

}  // namespace gridsync
