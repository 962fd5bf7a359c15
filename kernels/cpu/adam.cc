#include "kernels/cpu/adam.h"

#include "common/check.h"

namespace gridsync::cpu {
namespace {

// Bias corrections depend only on the row's step count; rows of one batch
// share few distinct counts, so remember the last one instead of calling
// pow twice per row.
class StepSizeCache {
 public:
  explicit StepSizeCache(const AdamHyper& hyper) : hyper_(hyper) {}
  float Get(uint32_t t) {
    if (t != last_t_) {
      last_t_ = t;
      last_ = AdamStepSize(hyper_, t);
    }
    return last_;
  }

 private:
  const AdamHyper& hyper_;
  uint32_t last_t_ = 0;
  float last_ = 0;
};

}  // namespace

void AdamUpdateRows(const AdamHyper& hyper, const SparseRows& grad, float grad_scale,
                    float* params, AdamTable* state) {
  GRIDSYNC_CHECK_EQ(grad.width, state->width);
  const uint32_t width = grad.width;
  StepSizeCache step_size(hyper);
  for (size_t i = 0; i < grad.rows.size(); ++i) {
    const size_t row = grad.rows[i];
    const float lr = step_size.Get(++state->step[row]);
    const float* g = grad.values.data() + i * width;
    for (uint32_t f = 0; f < width; ++f) {
      const size_t at = row * width + f;
      AdamUpdate(hyper, lr, g[f] * grad_scale, &params[at], &state->m[at], &state->v[at]);
    }
  }
}

void AdamUpdateDense(const AdamHyper& hyper, const float* grad, uint64_t rows, float grad_scale,
                     float* params, AdamTable* state) {
  const uint32_t width = state->width;
  StepSizeCache step_size(hyper);
  for (uint64_t row = 0; row < rows; ++row) {
    const float lr = step_size.Get(++state->step[row]);
    for (uint32_t f = 0; f < width; ++f) {
      const size_t at = row * width + f;
      AdamUpdate(hyper, lr, grad[at] * grad_scale, &params[at], &state->m[at], &state->v[at]);
    }
  }
}

}  // namespace gridsync::cpu
