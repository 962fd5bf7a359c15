// GradientSync: what differs between the sync modes, behind one seam, so
// that one TrainLoop (train_loop.h) runs every mode. A step is:
//
//   batch = sync.Prepare(step)        which samples this worker computes, and
//                                     the parameters they read made current
//                                     (pull from the PS, share in the node, or
//                                     nothing: the model is already current)
//   (the loop computes the gradient, in micro-batches, at the loss scale)
//   outcome = sync.Apply(step, grads) the gradient applied: local Adam; or
//                                     all-reduce then Adam; or push to the PS
//                                     (which runs Adam); or reduce-scatter in
//                                     the node then push
//   ... after the last step:
//   sync.Finish(report)               flush, barrier, final pull: afterwards
//                                     the worker with holds_model() has the
//                                     final parameters in its model
//
// Mixed precision: the loop computes at LossScale(); Apply rounds the
// gradient through fp16, checks it, and decides with every worker of the
// step whether it overflowed (an overflow anywhere skips the step
// everywhere); the loop's scaler then follows outcome.finite.
//
// Thread safety: one GradientSync per worker, used from one thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "worker/batch_split.h"
#include "worker/image_task.h"
#include "worker/model.h"
#include "worker/sync/step_observer.h"
#include "worker/sync/train_report.h"

namespace gridsync {

class PsClient;

// The samples one worker computes at one step.
struct StepBatch {
  uint64_t step = 0;
  uint64_t begin = 0;  // first sample of the step's global batch
  uint64_t count = 0;
  std::vector<float> positions;  // count x 2
  std::vector<float> targets;    // count x 3
};

// Samples [begin, begin + count) of a step's global batch: the same samples
// whichever worker draws them (the image task's counter-based sampling),
// drawn in parallel on `pool` when given (each sample depends only on its
// index, so the batch is the same either way). Fill is called from the
// thread that owns the pool.
class BatchSource {
 public:
  BatchSource(const ImageTask& image, uint64_t seed, ThreadPool* pool = nullptr)
      : image_(image), seed_(seed), pool_(pool) {}
  void Fill(uint64_t step, uint64_t begin, uint64_t count, StepBatch* out) const {
    out->step = step;
    out->begin = begin;
    out->count = count;
    out->positions.resize(count * 2);
    out->targets.resize(count * 3);
    constexpr uint64_t kChunk = 4096;
    const uint64_t chunks = (count + kChunk - 1) / kChunk;
    auto fill = [&](size_t c) {
      const uint64_t first = c * kChunk;
      const uint64_t n = std::min(kChunk, count - first);
      image_.SampleBatch(seed_, step, begin + first, n, out->positions.data() + first * 2,
                         out->targets.data() + first * 3);
    };
    ParallelForOn(pool_, chunks, fill);
  }

 private:
  const ImageTask& image_;
  uint64_t seed_;
  ThreadPool* pool_;
};

// Which share of each step's global batch every worker computes. Adaptive
// splitting changes it during the run; a change decided after step s takes
// effect at step s + 2, because a worker that prefetches (ssp) has already
// prepared step s + 1 with the old split.
class SplitSchedule {
 public:
  explicit SplitSchedule(BatchSplit split) : current_(std::move(split)), next_(current_) {}
  const BatchSplit& At(uint64_t step) const { return step >= next_from_ ? next_ : current_; }
  // Before the first step: every step splits by these rates.
  void ResetAll(const std::vector<double>& samples_per_second) {
    current_.Rebalance(samples_per_second);
    next_ = current_;
    next_from_ = UINT64_MAX;
  }
  // After step `done` - 1: rebalance by the measured rates (the same vector
  // on every worker). Returns whether the split changed.
  bool Rebalance(uint64_t done, const std::vector<double>& samples_per_second) {
    current_ = At(done);
    next_ = current_;
    next_from_ = done + 1;
    return next_.Rebalance(samples_per_second);
  }

 private:
  BatchSplit current_;
  BatchSplit next_;
  uint64_t next_from_ = UINT64_MAX;
};

struct SyncOutcome {
  bool finite = true;      // mixed precision: no worker overflowed (the step was applied)
  uint64_t grid_rows = 0;  // grid rows of this worker's gradient
};

class GradientSync {
 public:
  virtual ~GradientSync() = default;

  uint32_t rank() const { return rank_; }
  // "worker-3", or "standalone": how logs and errors name this worker.
  const std::string& me() const { return me_; }
  // Whether this worker holds the final model after Finish (rank 0).
  bool holds_model() const { return rank_ == 0; }

  // The model as it stands after `done` steps (every push of the steps
  // before, as the final pull would see it), for an evaluation in the middle
  // of a run, which changes nothing in the training. Called on the model
  // holder only, between Apply(done - 1) and Prepare(done). Null: the
  // training model itself, current in replicas (standalone, nccl); ps and
  // hybrid pull the whole model into a copy. Valid until the next call.
  virtual Result<HashGridModel*> Snapshot(uint64_t /*done*/) {
    return static_cast<HashGridModel*>(nullptr);
  }

  // The batch this worker computes at `step`, with the parameters it reads
  // current in the model. Valid until the next Prepare.
  virtual Result<const StepBatch*> Prepare(uint64_t step) = 0;

  // Applies the gradient of `step` (this worker's share of the global
  // batch, already divided by the global batch size, times loss_scale) and
  // clears `grads`.
  virtual Result<SyncOutcome> Apply(uint64_t step, ModelGradients* grads, float loss_scale) = 0;

  // Whether Apply takes the grid's gradient as GridGradient's compact form
  // (AccumulateCompact), which it reads only through the touched rows: the
  // loop then accumulates it so when the step has one micro-batch.
  virtual bool applies_compact_gradients() const { return false; }

  // A sync that computes the gradient itself and applies it in one call
  // (the model on a GPU: device_sync.h). The loop then calls TrainStep
  // instead of the model's AccumulateGradients and Apply: it computes the
  // gradient of `batch` (in training.gradient_accumulation micro-batches) at
  // `loss_scale`, applies it as Apply would, fills *outcome, and returns the
  // batch's sum of squared errors.
  virtual bool trains_steps() const { return false; }
  virtual Result<double> TrainStep(const StepBatch& /*batch*/, size_t /*global_batch*/,
                                   uint32_t /*active_levels*/, float /*loss_scale*/,
                                   SyncOutcome* /*outcome*/) {
    return Status::Internal("this sync does not train steps itself");
  }

  // After the last step (training.steps): see the file comment.
  virtual Status Finish(uint64_t end_step, TrainReport* report) = 0;

  // Adaptive splitting: every worker's samples per second of compute over
  // the last interval (the same vector on every worker), given this one's.
  virtual Result<std::vector<double>> GatherRates(uint64_t done, double mine) = 0;

  // Between steps: fails when a peer or the coordinator is gone, naming it,
  // so no mode waits for the end of training (or a full timeout) to notice.
  virtual Status CheckPeers() { return Status::OK(); }

  // After `failure` of any call above: whether the job rolled back to a
  // checkpoint (a restarted shard rejoined it), waiting up to the timeout
  // for that to happen. Returns the step to carry on from, with this
  // worker's state (and its sync's) as they were at that step; or `failure`
  // when the job cannot go on. The loop winds back its own evaluations and
  // gradients; the loss scale of mixed precision is not wound back (the run
  // stays correct, but is no longer bit-identical to an uninterrupted one).
  virtual Result<uint64_t> Recover(const Status& failure) { return failure; }

  // The PS client this sync pushes through (ps, hybrid), or null: where the
  // model's device takes over the push codecs (device_staged_sync.h).
  virtual PsClient* ps_client() { return nullptr; }

  // Communication figures for the report (bytes, seconds, staleness).
  virtual void FillReport(TrainReport* /*report*/) const {}

  // The same, cumulative and split by phase, for per-step records
  // (step_observer.h).
  virtual SyncTimes times() const { return {}; }

 protected:
  uint32_t rank_ = 0;
  std::string me_ = "standalone";
};

// Rounds gradients through fp16, as an fp16 pipeline would carry them, and
// reports whether all of them fit (no inf, NaN or magnitude above 65504):
// the per-worker half of the mixed-precision overflow check.
bool RoundToHalfChecked(float* values, size_t n);

// Moves the grid gradient's touched rows into rows[level] (level-local ids,
// ascending), dense or compact (the grid is then clear and dense again),
// and, under mixed precision, rounds them and the MLP gradients through
// fp16. Returns whether every value fit (always true without mixed
// precision).
bool TakeGradients(ModelGradients* grads, bool mixed_precision, std::vector<SparseRows>* rows,
                   ThreadPool* pool);

}  // namespace gridsync
