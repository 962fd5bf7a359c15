// The optimizer of standalone training: Adam on the worker itself, with
// dynamic loss scaling under mixed precision. Grid levels are updated
// sparsely (touched rows only, per-row step counts); MLP weights densely.
// With the PS the same Adam runs on the shards instead.
//
// Thread safety: not thread-safe; parallelism is internal via a ThreadPool.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "common/sparse_rows.h"
#include "common/thread_pool.h"
#include "kernels/cpu/adam.h"
#include "worker/loss_scaler.h"
#include "worker/model.h"

namespace gridsync {

class LocalOptimizer {
 public:
  LocalOptimizer(HashGridModel* model, const Config& config);

  struct StepStats {
    bool applied = false;      // false when the loss scaler skipped the step
    uint64_t grid_rows = 0;    // grid rows updated (touched)
    float loss_scale = 1.0f;   // the scale the gradients carried
  };

  // Applies and clears the gradients accumulated at the current loss scale.
  StepStats Step(ModelGradients* grads, ThreadPool* pool);

  float loss_scale() const { return scaler_.scale(); }
  const LossScaler& scaler() const { return scaler_; }
  const std::vector<cpu::AdamTable>& grid_state() const { return grid_state_; }

 private:
  HashGridModel* model_;
  AdamHyper hyper_;
  LossScaler scaler_;
  std::vector<cpu::AdamTable> grid_state_;  // per level
  std::vector<cpu::AdamTable> mlp_state_;   // per weight matrix
  std::vector<SparseRows> touched_;         // per level, reused
};

}  // namespace gridsync
