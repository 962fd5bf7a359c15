#include "kernels/cpu/adam.h"

#include <cmath>

#include "common/check.h"
#include "common/prefetch.h"
#include "common/state_bytes.h"
#include "kernels/cpu/adam_batch.h"

namespace gridsync::cpu {

namespace {

// Rows ahead to prefetch. With the update vectorised (adam_batch.h) a row
// costs a few ns and a touched row of a large level misses to DRAM, so the
// lead must cover well over 100 ns for four or five streams at once. Into L2
// (common/prefetch.h), 128 rows measured faster than 48, 96, 160 and 256 in
// `gridsync-bench train` (single thread, alternating runs, 2026-12-02);
// into L1 the best was 48.
constexpr size_t kPrefetchDistance = 128;

// Width as a template parameter lets the compiler unroll and keep the row in
// registers; the hash grid's widths are 1, 2, 4 or 8.
template <uint32_t W>
void UpdateRowsFixed(const AdamHyper& hyper, const uint32_t* rows, size_t n, const float* values,
                     float grad_scale, float* params, AdamTable* state) {
  float* m = state->m.data();
  float* v = state->v.data();
  uint32_t* steps = state->step.data();
  AdamRowBatch<W> batch(hyper, params, m, v);
  for (size_t i = 0; i < n; ++i) {
    // Touched rows of a hashed level are scattered over the table; the
    // hardware prefetcher cannot guess them, but we know them in advance.
    if (i + kPrefetchDistance < n) {
      const size_t ahead = rows[i + kPrefetchDistance];
      PrefetchRow(&params[ahead * W]);
      PrefetchRow(&m[ahead * W]);
      PrefetchRow(&v[ahead * W]);
      PrefetchRow(&steps[ahead]);
    }
    const size_t row = rows[i];
    if (!RowHasGradient(values + i * W, W)) continue;
    const float lr = state->StepSize(hyper, ++steps[row]);
    batch.Add(values + i * W, grad_scale, lr, row);
  }
  batch.Flush();
}

}  // namespace

float AdamTable::ExtendMemo(const AdamHyper& hyper, uint32_t t) {
  if (t >= kMemoSteps) return AdamStepSize(hyper, t);
  if (hyper.learning_rate != step_size_lr) step_size.clear();
  step_size_lr = hyper.learning_rate;
  const size_t first = step_size.size();
  step_size.resize(
      std::min<size_t>(kMemoSteps, std::max<size_t>(size_t{t} + 1, 2 * step_size.size())));
  for (size_t k = first; k < step_size.size(); ++k) {
    step_size[k] = k == 0 ? 0.0f : AdamStepSize(hyper, static_cast<uint32_t>(k));
  }
  return step_size[t];
}

Status CheckStepCounts(const AdamTable& state, uint64_t step, const std::string& what) {
  const auto beyond = std::find_if(state.step.begin(), state.step.end(),
                                   [step](uint32_t count) { return count > step; });
  if (beyond == state.step.end()) return Status::OK();
  return Status::InvalidArgument(
      what + ": row " + std::to_string(beyond - state.step.begin()) + " has Adam step count " +
      std::to_string(*beyond) + ", beyond the checkpoint's step " + std::to_string(step) +
      "; allowed: at most the step (a row steps at most once a step), so the file is damaged "
      "or not this run's");
}

void AppendAdamTable(const AdamTable& state, std::string* out) {
  AppendArray(out, state.m);
  AppendArray(out, state.v);
  AppendArray(out, state.step);
}

Status TakeAdamTable(std::string_view* in, uint64_t step, const std::string& what,
                     AdamTable* state) {
  if (in->size() < AdamTableBytes(*state) || !TakeArray(in, &state->m) ||
      !TakeArray(in, &state->v) || !TakeArray(in, &state->step)) {
    return Status::Corruption(what + ": the Adam state is shorter than its " +
                              std::to_string(state->step.size()) + " rows x " +
                              std::to_string(state->width) + " values");
  }
  GRIDSYNC_RETURN_IF_ERROR(CheckStepCounts(*state, step, what));
  return CheckMoments(*state, what);
}

uint64_t AdamTableBytes(const AdamTable& state) {
  return (state.m.size() + state.v.size()) * sizeof(float) + state.step.size() * sizeof(uint32_t);
}

Status CheckMoments(const AdamTable& state, const std::string& what) {
  const auto bad_m =
      std::find_if(state.m.begin(), state.m.end(), [](float x) { return !std::isfinite(x); });
  const auto bad_v = std::find_if(state.v.begin(), state.v.end(),
                                  [](float x) { return !std::isfinite(x) || x < 0.0f; });
  const bool m_bad = bad_m != state.m.end();
  if (!m_bad && bad_v == state.v.end()) return Status::OK();
  const size_t at = m_bad ? bad_m - state.m.begin() : bad_v - state.v.begin();
  const size_t width = state.width == 0 ? 1 : state.width;
  return Status::Corruption(
      what + ": Adam's " + (m_bad ? "m" : "v") + " at row " + std::to_string(at / width) +
      ", column " + std::to_string(at % width) + " is " + std::to_string(m_bad ? *bad_m : *bad_v) +
      "; allowed: " + (m_bad ? "a finite value" : "a finite value of at least 0") +
      " (what training makes), so the file is damaged or not this run's");
}

void AdamUpdateRows(const AdamHyper& hyper, const SparseRows& grad, float grad_scale, float* params,
                    AdamTable* state) {
  GRIDSYNC_CHECK_EQ(grad.width, state->width);
  GRIDSYNC_CHECK_EQ(grad.values.size(), grad.rows.size() * grad.width);
  AdamUpdateRows(hyper, grad.rows.data(), grad.rows.size(), grad.values.data(), grad_scale, params,
                 state);
}

void AdamUpdateRows(const AdamHyper& hyper, const uint32_t* rows, size_t n, const float* values,
                    float grad_scale, float* params, AdamTable* state) {
  switch (state->width) {
    case 1:
      return UpdateRowsFixed<1>(hyper, rows, n, values, grad_scale, params, state);
    case 2:
      return UpdateRowsFixed<2>(hyper, rows, n, values, grad_scale, params, state);
    case 4:
      return UpdateRowsFixed<4>(hyper, rows, n, values, grad_scale, params, state);
    case 8:
      return UpdateRowsFixed<8>(hyper, rows, n, values, grad_scale, params, state);
    default:
      break;
  }
  const uint32_t width = state->width;
  for (size_t i = 0; i < n; ++i) {
    const size_t row = rows[i];
    const float* g = values + i * width;
    if (!RowHasGradient(g, width)) continue;
    const float lr = state->StepSize(hyper, ++state->step[row]);
    for (uint32_t f = 0; f < width; ++f) {
      const size_t at = row * width + f;
      AdamUpdate(hyper, lr, g[f] * grad_scale, &params[at], &state->m[at], &state->v[at]);
    }
  }
}

namespace {

// AdamUpdateIndexed, with the width known at compile time (W > 0: the
// compiler unrolls the row) or at run time (W = 0: `width`).
template <uint32_t W>
void UpdateIndexed(const AdamHyper& hyper, const uint32_t* rows, size_t n, float* grad,
                   float* params, AdamTable* state, bool skip_zero_rows, float lr_scale,
                   uint32_t width) {
  const uint32_t w = W > 0 ? W : width;
  float* m = state->m.data();
  float* v = state->v.data();
  uint32_t* steps = state->step.data();
  // W = 0 (any width) keeps the row-at-a-time loop; the batch needs W.
  AdamRowBatch<(W > 0 ? W : 1)> batch(hyper, params, m, v);
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchDistance < n) {
      const size_t ahead = size_t{rows[i + kPrefetchDistance]} * w;
      PrefetchRow(&params[ahead]);
      PrefetchRow(&grad[ahead]);
      PrefetchRow(&m[ahead]);
      PrefetchRow(&v[ahead]);
      PrefetchRow(&steps[rows[i + kPrefetchDistance]]);
    }
    const size_t row = rows[i];
    float* g = grad + row * w;
    if (skip_zero_rows && !RowHasGradient(g, w)) continue;  // already zero
    const float lr = state->StepSize(hyper, ++steps[row]) * lr_scale;
    if constexpr (W > 0) {
      batch.Add(g, 1.0f, lr, row);
      for (uint32_t f = 0; f < W; ++f) g[f] = 0.0f;
      continue;
    }
    for (uint32_t f = 0; f < w; ++f) {
      const size_t at = row * w + f;
      AdamUpdate(hyper, lr, g[f], &params[at], &m[at], &v[at]);
      g[f] = 0.0f;
    }
  }
  if constexpr (W > 0) batch.Flush();
}

}  // namespace

void AdamUpdateIndexed(const AdamHyper& hyper, const uint32_t* rows, size_t n, float* grad,
                       float* params, AdamTable* state, bool skip_zero_rows, float lr_scale) {
  const uint32_t width = state->width;
  switch (width) {
    case 1:
      return UpdateIndexed<1>(hyper, rows, n, grad, params, state, skip_zero_rows, lr_scale, 1);
    case 2:
      return UpdateIndexed<2>(hyper, rows, n, grad, params, state, skip_zero_rows, lr_scale, 2);
    case 4:
      return UpdateIndexed<4>(hyper, rows, n, grad, params, state, skip_zero_rows, lr_scale, 4);
    case 8:
      return UpdateIndexed<8>(hyper, rows, n, grad, params, state, skip_zero_rows, lr_scale, 8);
    default:
      return UpdateIndexed<0>(hyper, rows, n, grad, params, state, skip_zero_rows, lr_scale, width);
  }
}

void AdamUpdateDense(const AdamHyper& hyper, const float* grad, uint64_t rows, float grad_scale,
                     float* params, AdamTable* state) {
  const uint32_t width = state->width;
  for (uint64_t row = 0; row < rows; ++row) {
    const float lr = state->StepSize(hyper, ++state->step[row]);
    for (uint32_t f = 0; f < width; ++f) {
      const size_t at = row * width + f;
      AdamUpdate(hyper, lr, grad[at] * grad_scale, &params[at], &state->m[at], &state->v[at]);
    }
  }
}

}  // namespace gridsync::cpu
