// gradient_sync "ps": this worker takes its slice of every global batch,
// pulls the parameter rows the slice reads (known from the lookup before
// the forward pass), computes gradients and pushes the touched rows to the
// PS shards, which run Adam (or, with ps.optimizer worker, applies Adam here
// and pushes updates). The pull for step s+1 is sent right after the push
// of step s, in every consistency mode, so every read holds this worker's
// own last push. (ssp once sent it before computing step s, to overlap the
// transfer with compute; reading parameters without one's own last push
// cost 15 dB on configs/local.json, and is gone.) Under ssp and async the
// shards send stale reads looked ahead (ShardStore::GatherAhead).
//
// Mixed precision: the pushed gradients are rounded through fp16 at the
// loss scale, then unscaled; a worker that overflowed pushes an empty,
// flagged push (PsClient::PushSkipped) and the shards apply none of the
// step. Pulled rows refresh the model's fp16 working copy.
//
// With bsp and no compression the parameters equal those of one process
// training with gradient_accumulation = world_size on the same global
// batches, bit for bit: worker w's slice is micro-batch w, and the shards sum
// the pushes in worker-rank order, as the local trainer sums micro-batches.
//
// Thread safety: see gradient_sync.h.
#pragma once

#include <optional>

#include "common/thread_pool.h"
#include "kernels/cpu/hash_encoding.h"
#include "spec/run_spec.h"
#include "worker/sync/gradient_sync.h"
#include "worker/sync/ps_session.h"

namespace gridsync {

class PsSync : public PsSessionSync {
 public:
  PsSync(const RunSpec& spec, HashGridModel* model, PsSession session, const BatchSource* source,
         const SplitSchedule* split, ThreadPool* pool, const WorkerOptions& options);

  Result<const StepBatch*> Prepare(uint64_t step) override;
  Result<SyncOutcome> Apply(uint64_t step, ModelGradients* grads, float loss_scale) override;
  // Apply takes every level's rows whole (TakeGradients), which a compact
  // gradient hands over in order, without gathering scattered rows.
  bool applies_compact_gradients() const override { return true; }
  Result<HashGridModel*> Snapshot(uint64_t done) override;
  // A shard restarted and rejoined from its checkpoint: the job goes back
  // to that step, and this worker with it (the next pull is sent afresh).
  Result<uint64_t> Recover(const Status& failure) override;

 private:
  // One step's slice of the global batch and the rows it reads.
  struct Prepared {
    StepBatch batch;
    cpu::GridBatchLookup lookup;
    std::vector<TablePullRef> pulls;  // valid until the next step is prepared
  };
  // Samples `step`'s slice and looks up its rows (prepared_), unless
  // prepared_ holds that step's already.
  void PrepareBatch(uint64_t step);
  // PrepareBatch, then sends the pull of the rows.
  Status SendPrepare(uint64_t step);

  const BatchSource* source_;
  const SplitSchedule* split_;
  ThreadPool* pool_;
  const uint64_t steps_;
  bool sent_first_ = false;
  // Snapshot received the next step's pull (at this version) for Prepare.
  bool received_ = false;
  uint64_t received_version_ = 0;
  cpu::GridRowSet row_set_;
  Prepared prepared_;
  // The step prepared_ holds the batch of: Apply prepares the next one while
  // its push is applied (PsClient::Push's while_acks).
  std::optional<uint64_t> batch_step_;
  std::vector<SparseRows> touched_;  // per level, reused
  uint64_t read_version_ = 0;        // the version the current step read
};

}  // namespace gridsync
