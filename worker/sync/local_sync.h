// Standalone training (one process, or distributed.enable false): the
// worker computes the whole global batch and runs Adam itself
// (LocalOptimizer). The reference every distributed mode is tested against.
//
// Thread safety: see gradient_sync.h.
#pragma once

#include "common/config.h"
#include "common/thread_pool.h"
#include "worker/local_optimizer.h"
#include "worker/sync/gradient_sync.h"

namespace gridsync {

class LocalSync : public GradientSync {
 public:
  LocalSync(const RunSpec& spec, HashGridModel* model, const BatchSource* source, ThreadPool* pool);

  Result<const StepBatch*> Prepare(uint64_t step) override;
  Result<SyncOutcome> Apply(uint64_t step, ModelGradients* grads, float loss_scale) override;
  // Apply reads the touched rows only: ApplyTouched in fp32, TakeGradients
  // under mixed precision.
  bool applies_compact_gradients() const override { return true; }
  Status Finish(uint64_t, TrainReport*) override { return Status::OK(); }
  Result<std::vector<double>> GatherRates(uint64_t, double mine) override {
    return std::vector<double>{mine};
  }

 private:
  const Config& config_;
  const BatchSource* source_;
  ThreadPool* pool_;
  LocalOptimizer optimizer_;
  StepBatch batch_;
  std::vector<SparseRows> rows_;  // per level, reused
};

}  // namespace gridsync
