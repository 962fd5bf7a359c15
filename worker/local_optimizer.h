// Adam on the worker itself (standalone runs and gradient_sync "nccl", where
// every worker holds the whole model): grid levels are updated sparsely
// (rows with a gradient only, per-row step counts), MLP weights densely.
// With the PS the same Adam runs on the shards instead. Loss scaling is the
// caller's (TrainLoop's LossScaler): gradients arrive times the loss scale
// and are multiplied by `grad_scale` = 1 / loss scale here.
//
// Parallelism is internal via a ThreadPool, over slices of the levels' rows
// rather than whole levels: a step's touched rows sit mostly on the few
// finest levels, so levels alone would leave most of many threads idle.
// Rows are updated independently, so the slicing changes no result.
//
// Thread safety: not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/sparse_rows.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/cpu/adam.h"
#include "worker/model.h"

namespace gridsync {

class LocalOptimizer {
 public:
  LocalOptimizer(HashGridModel* model, const AdamHyper& hyper);

  // rows[level]: the level's rows and their gradients (strictly ascending:
  // each row once, GridGradient::Take's order). Updates
  // them and every MLP weight, zeroes `mlp`, refreshes the model's fp16
  // working copy. Returns the grid rows updated.
  uint64_t ApplyRows(const std::vector<SparseRows>& rows, cpu::MlpWeights* mlp, float grad_scale,
                     ThreadPool* pool);

  // The same at grad_scale 1 straight from the gradient's dense buffer: the
  // touched rows' ids are read from its bitmap and Adam reads (and zeroes)
  // each row where it lies, with no copy into SparseRows first. Equal to
  // Take then ApplyRows bit for bit. Clears `grads`. A compact grid gradient
  // (GridGradient::AccumulateCompact) gives the same bits, read in order.
  uint64_t ApplyTouched(ModelGradients* grads, ThreadPool* pool);

  // The grid gradient as one dense buffer (total_rows x features, e.g. after
  // an all-reduce): updates the rows whose gradient is not zero and zeroes
  // them; then the MLP as ApplyRows does. Returns the grid rows updated.
  uint64_t ApplyDense(float* grid_grad, cpu::MlpWeights* mlp, float grad_scale, ThreadPool* pool);

  const std::vector<cpu::AdamTable>& grid_state() const { return grid_state_; }

  // Adam's state (every level's and MLP matrix's m, v and step counts) as
  // checkpoint bytes, and back: RestoreState takes StateBytes() from the
  // front of *in (sizes from the model, never from the bytes) and refuses
  // step counts beyond `step`, the checkpoint's; afterwards the optimizer
  // is as it was after `step` applies.
  void AppendState(std::string* out) const;
  Status RestoreState(std::string_view* in, uint64_t step);
  uint64_t StateBytes() const;

 private:
  void ApplyMlp(cpu::MlpWeights* mlp, float grad_scale);
  // Every Apply call begins here: counts the call and extends every level's
  // step-size memo to the count, past any row's next step, so that slices
  // of one level can step it concurrently (AdamTable::StepSize).
  void BeginApply();

  // Rows [begin, end) of a level: the unit of work of ApplyTouched and
  // ApplyDense, costliest first.
  struct Slice {
    uint32_t level;
    uint64_t begin;
    uint64_t end;
  };

  HashGridModel* model_;
  AdamHyper hyper_;
  std::vector<cpu::AdamTable> grid_state_;  // per level
  std::vector<cpu::AdamTable> mlp_state_;   // per weight matrix
  std::vector<Slice> slices_;
  // Each Apply call steps a row at most once, so no row's step count passes
  // the number of calls (the bound BeginApply reserves for).
  uint32_t applies_ = 0;
  std::vector<std::vector<uint32_t>> rows_;  // per slice, reused
};

}  // namespace gridsync
