// compression.codec fp16 or bf16 under gradient_sync "nccl": the gradient is
// all-reduced as 16-bit floats (Collective::AllReduceSumHalf), half the
// bytes of the fp32 all-reduce, as DDP's fp16/bf16 compression hooks do.
//
// One step:
//   1. tensors under compression.min_bytes travel in fp32, in a small header
//      all-reduce that also carries the overflow count, the sum over ranks
//      of each rank's largest |gradient|, and the 16-bit element count (a
//      rank with another layout fails fast, naming both counts);
//   2. fp16 only: every rank scales by the same power of two, so that the
//      header's bound on any partial sum lands near 2^15 and no partial sum
//      can overflow (65504) or lose small values to underflow; the scale is
//      exact, so it costs no precision;
//   3. the rest is rounded to the format and summed in buckets of
//      distributed.bucket_mb;
//   4. with compression.error_feedback, what rounding lost is kept per
//      element (in unscaled gradient units, so a changing loss scale does
//      not distort it) and added back the next time this worker's gradient
//      touches that element: only then, because a grid row that no worker
//      touched must sum to exactly zero (sparse Adam steps only the rows
//      with a gradient; a leaked residual would move every row).
// Every rank sees the same header and the same sums, so the decision to
// skip a step (an overflow anywhere, or a non-finite sum) is the same on all.
//
// Thread safety: one object per worker, used from its training thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "worker/collective/collective.h"

namespace gridsync {

class HalfAllReduce {
 public:
  HalfAllReduce(HalfFormat format, bool error_feedback, size_t min_bytes, size_t bucket_bytes);

  // Sums `tensors` across `group` in place. `overflow` is 1 when this
  // worker's gradient did not fit (mixed precision), else 0; `loss_scale`
  // is the factor the gradient carries. Returns whether the step applies:
  // false when any worker overflowed or a sum is not finite, on every rank
  // alike (the tensors then hold garbage and the caller clears them).
  Result<bool> Run(Collective& group, std::span<const std::span<float>> tensors, bool overflow,
                   float loss_scale, ThreadPool* pool);

  // Bytes this worker all-reduced in the last step (16-bit payload plus the
  // fp32 header).
  size_t bytes_per_step() const { return bytes_per_step_; }

 private:
  const HalfFormat format_;
  const bool error_feedback_;
  const size_t min_bytes_;
  const size_t bucket_values_;    // 16-bit values per all-reduce
  std::vector<uint16_t> packed_;  // the 16-bit tensors, end to end
  std::vector<float> residual_;   // error feedback, unscaled, same layout
  std::vector<float> header_;
  size_t bytes_per_step_ = 0;
};

}  // namespace gridsync
