// Sparse Adam on the CPU: updates the given rows of a table and nothing else.
// The same routine serves the standalone trainer and, later, the PS shard.
//
// Thread safety: an AdamTable must not be updated from two calls at once,
// except calls on disjoint rows once ReserveSteps has covered every step
// they reach (StepSize then only reads its memo); distinct tables may be
// updated concurrently.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/huge_pages.h"
#include "common/sparse_rows.h"
#include "common/status.h"
#include "kernels/adam_math.h"

namespace gridsync::cpu {

// Optimizer state of one table of rows x width parameters.
struct AdamTable {
  uint32_t width = 0;
  // On huge pages (common/huge_pages.h): touched at scattered rows.
  HugePageVector<float> m;
  HugePageVector<float> v;
  HugePageVector<uint32_t> step;  // per row

  void Resize(uint64_t rows, uint32_t row_width) {
    width = row_width;
    m.assign(rows * row_width, 0.0f);
    v.assign(rows * row_width, 0.0f);
    step.assign(rows, 0);
  }

  // AdamStepSize(hyper, t), memoised: rows of one batch carry many different
  // step counts, and two pow() calls per row would cost more than the update.
  // The memo covers steps below kMemoSteps; later steps (runs that long, or
  // a hostile checkpoint's counts) are computed, with the same bits: a step
  // count must never size an allocation.
  static constexpr uint32_t kMemoSteps = uint32_t{1} << 16;

  // Extends the memo to step t so that concurrent StepSize calls on
  // disjoint rows (which then only read it, or compute past it) are safe.
  void ReserveSteps(const AdamHyper& hyper, uint32_t t) { StepSize(hyper, t); }

  // Read-only: the memo when it reaches t, else computed (for readers that
  // must not extend the memo, such as concurrent pulls).
  float StepSizeAt(const AdamHyper& hyper, uint32_t t) const {
    return t < step_size.size() && hyper.learning_rate == step_size_lr ? step_size[t]
                                                                       : AdamStepSize(hyper, t);
  }

  // The memo's hit stays inline (a call per touched row showed as 6% of a
  // shard's time in `gridsync-bench load`); extending it does not.
  float StepSize(const AdamHyper& hyper, uint32_t t) {
    if (t < step_size.size() && hyper.learning_rate == step_size_lr) [[likely]] {
      return step_size[t];
    }
    return ExtendMemo(hyper, t);
  }

 private:
  // StepSize past the memo: extends it to t (below kMemoSteps) or computes.
  float ExtendMemo(const AdamHyper& hyper, uint32_t t);

  std::vector<float> step_size;
  float step_size_lr = 0.0f;
};

// Status of a restored state's step counts: InvalidArgument naming `what`,
// the first row and its count when a count exceeds `step`, the step of the
// checkpoint it came from (a row steps at most once a step, so a larger
// count is a damaged or forged file).
Status CheckStepCounts(const AdamTable& state, uint64_t step, const std::string& what);

// Status of a restored state's moments: Corruption naming `what`, the row,
// the column and the value when an m is not finite or a v is not finite
// and at least 0 (v is a mean of squares). Training never makes either, and
// a step from one would turn the row's parameters into NaN without a word.
Status CheckMoments(const AdamTable& state, const std::string& what);

// A table's m, v and step counts as checkpoint bytes (common/state_bytes.h),
// and back into a table of the same size (`state`, already Resize'd: the
// reader knows every size, so nothing is allocated from the bytes).
// TakeAdamTable: Corruption naming `what` when too few bytes remain, then
// CheckStepCounts' refusal for counts beyond the checkpoint's `step` and
// CheckMoments'.
void AppendAdamTable(const AdamTable& state, std::string* out);
Status TakeAdamTable(std::string_view* in, uint64_t step, const std::string& what,
                     AdamTable* state);
uint64_t AdamTableBytes(const AdamTable& state);

// Applies Adam to `grad.rows` of `params` (rows x width) whose gradient is
// not all zero (see kernels/adam_math.h), each gradient multiplied by
// `grad_scale` first (1/loss_scale for mixed precision,
// 1/samples for a sum of per-sample gradients).
void AdamUpdateRows(const AdamHyper& hyper, const SparseRows& grad, float grad_scale, float* params,
                    AdamTable* state);
// The same for n rows whose gradients lie in `values` (n x width, row i's
// first), such as a compact gradient (GridGradient::CompactValues).
void AdamUpdateRows(const AdamHyper& hyper, const uint32_t* rows, size_t n, const float* values,
                    float grad_scale, float* params, AdamTable* state);

// Variant for gradients kept in a dense per-row buffer (a PS shard summing
// several pushes): updates rows[0..n) and zeroes their gradient rows, so the
// buffer is clean for the next step. Row order does not matter.
// skip_zero_rows: false for dense tables (see AdamUpdateDense).
// lr_scale multiplies the step size (1: exactly Adam's).
void AdamUpdateIndexed(const AdamHyper& hyper, const uint32_t* rows, size_t n, float* grad,
                       float* params, AdamTable* state, bool skip_zero_rows = true,
                       float lr_scale = 1.0f);

// Dense variant: every row of a table whose gradient lies in `grad` (rows x
// width, row-major), as for MLP weights. Like tiny-cuda-nn's matrix weights,
// these always step, zero gradient or not (a ReLU unit that is silent for a
// while keeps moving on its momentum); only sparse (hash-grid) rows skip.
void AdamUpdateDense(const AdamHyper& hyper, const float* grad, uint64_t rows, float grad_scale,
                     float* params, AdamTable* state);

}  // namespace gridsync::cpu
