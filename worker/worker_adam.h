// Adam on the worker, for ps.optimizer = worker: turns the gradient rows of
// a push into parameter updates (the negated Adam step), which the shards
// average per row and add.
//
// Why: lossy codecs with error feedback (onebit, topk) deliver a gradient in
// late bursts or as alternating signs; Adam on the shard normalises each
// burst to one step of size ~lr, so what error feedback carried over is
// lost. Compressing the update after Adam's normalisation instead keeps
// error feedback's promise: every update is delivered, some of it later
// (the approach of 1-bit Adam and DGC, here with each worker's own m and v).
//
// Same rules as Adam on the shard (kernels/adam_math.h): per-row step
// counts; a sparse row whose gradient is all zero does not step and is left
// out of the push; dense tables (MLP weights) always step.
//
// Thread safety: not thread-safe; one per PsClient.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/sharding.h"
#include "common/thread_pool.h"
#include "common/uninit_vector.h"
#include "kernels/adam_math.h"
#include "kernels/cpu/adam.h"
#include "worker/ps_client.h"

namespace gridsync {

// DGC's momentum factor masking over a table's m (rows of `stride`
// floats): m[rows[i] * stride + col + f] = 0 wherever delivered[i * cw + f]
// (the payload's decoded values, n x cw) is not zero.
void MaskMomentumRows(float* m, size_t stride, const uint32_t* rows, size_t n, uint32_t col,
                      uint32_t cw, const float* delivered);

class WorkerAdam {
 public:
  WorkerAdam(const Partition& partition, const AdamHyper& hyper);

  // The update rows for `gradients`: same tables, rows in the same order
  // (sparse rows with no gradient dropped), values = -(Adam step). The
  // returned refs point into this object's buffers and stay valid until the
  // next call, unless the client took them: they offer those buffers
  // (TableRowsRef::give_*), which the next call sizes afresh. A table listed
  // twice steps twice, in list order, each listing with its own updates.
  // Tables run in parallel on `pool` (null: on this thread); the result is
  // the same either way.
  std::vector<TableRowsRef> ToUpdates(const std::vector<TableRowsRef>& gradients,
                                      ThreadPool* pool = nullptr);

  // Refs marked on_device pass through ToUpdates as they are: their Adam
  // ran on the model's device (PsClient's DevicePushSource::ToUpdates),
  // whose state is brought here for checkpoints through State.
  // Table t's state, made (zeroed) if it has none; whether it has one.
  cpu::AdamTable* State(uint32_t t);
  bool HasState(uint32_t t) const { return !state_[t].step.empty(); }

  // Momentum factor masking: zeroes m where `delivered` (rows x cw values of
  // columns [col, col+cw)) is non-zero.
  void MaskMomentum(uint32_t table, const uint32_t* rows, size_t n, uint32_t col, uint32_t cw,
                    const float* delivered);

  // Optimizer state bytes held (tables get state on their first push).
  size_t StateBytes() const;

  // Checkpoints (worker/worker_checkpoint.h): per table, whether it has
  // state, then m, v and the per-row step counts. RestoreState replaces the
  // state and consumes its bytes from `in`; Corruption when they do not fit
  // this partition's tables (checked before a table's state is made) or
  // hold moments no training makes (cpu::CheckMoments); InvalidArgument
  // when a row's step count exceeds `step`, the checkpoint's.
  void AppendState(std::string* out) const;
  Status RestoreState(std::string_view* in, uint64_t step);

 private:
  // One table of ToUpdates: fills out_[ref.table]; returns the rows kept.
  size_t UpdateTable(const TableRowsRef& ref);

  struct Table {
    std::vector<uint32_t> rows;  // this push's update rows (sparse)
    UninitVector<float> values;  // and their updates (a push block may take them)
  };
  const Partition& partition_;
  AdamHyper hyper_;
  std::vector<cpu::AdamTable> state_;  // per table, empty until first used
  std::vector<Table> out_;             // per table
  std::vector<Table> repeated_;        // per listing, when ToUpdates lists a table twice
};

}  // namespace gridsync
