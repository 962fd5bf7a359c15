// Adam's per-element update, shared by the CPU and CUDA kernels.
//
// tiny-cuda-nn's form: each row keeps its own step count, so a hash-grid row
// that few batches touch gets the bias correction of its own history, and a
// row whose gradient is exactly zero (untouched) is not updated at all: its
// step count stays, its m and v do not decay. Deciding by the gradient value
// rather than by who touched the row gives every sync mode (local, PS,
// all-reduce) the same rule, whatever the summation route. Dense tables
// (MLP weights) always step, as tiny-cuda-nn's matrix weights do.
//   m <- b1*m + (1-b1)*g
//   v <- b2*v + (1-b2)*g^2
//   w <- w - lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
//
// Thread safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace gridsync {

struct AdamHyper {
  float learning_rate = 1e-2f;
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float epsilon = 1e-15f;
};

// The bias-corrected step size for a row at step t (t >= 1), in float on
// both CPU and GPU so the twins agree.
GRIDSYNC_HOST_DEVICE inline float AdamStepSize(const AdamHyper& h, uint32_t t) {
  return h.learning_rate * sqrtf(1.0f - powf(h.beta2, static_cast<float>(t))) /
         (1.0f - powf(h.beta1, static_cast<float>(t)));
}

// Whether a row of `width` gradient values has any non-zero entry (g != 0:
// +-0 is none, a NaN is one).
GRIDSYNC_HOST_DEVICE inline bool RowHasGradient(const float* g, uint32_t width) {
#ifdef __CUDA_ARCH__
  for (uint32_t f = 0; f < width; ++f) {
    if (g[f] != 0.0f) return true;
  }
  return false;
#else
  // The same test on the magnitude bits, without a branch per value: a
  // float compare costs an unordered test and two branches, and sparse
  // Adam makes this test on every row it is given.
  uint32_t magnitude = 0;
  for (uint32_t f = 0; f < width; ++f) {
    uint32_t bits;
    std::memcpy(&bits, g + f, sizeof(bits));
    magnitude |= bits & 0x7fffffffu;
  }
  return magnitude != 0;
#endif
}

// Updates m and v with gradient g and returns the amount to subtract from
// the parameter. A worker-side optimizer (ps.optimizer = worker) sends the
// negated step and the shard adds it: w + (-d) equals w - d exactly, so one
// worker ends bit for bit where Adam on the shard would.
//
// The two moment updates are fused multiply-adds, spelled out, wherever the
// hardware has them (FMA on x86-64-v3, every CUDA GPU): the compiler would
// contract them anyway, but which products it fuses is its choice per call
// site, and the vectorised CPU batch (cpu/adam_batch.h) must produce the
// same bits as every scalar copy. A CPU build without FMA
// (GRIDSYNC_CPU_ARCH="") multiplies and adds, in every copy alike; its
// results then differ from the GPU's in the last bits (the CPU/GPU twin
// tests compare with a tolerance).
GRIDSYNC_HOST_DEVICE inline float AdamFma(float a, float b, float c) {
#if defined(__CUDA_ARCH__) || defined(__FMA__)
  return fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

GRIDSYNC_HOST_DEVICE inline float AdamStep(const AdamHyper& h, float step_size, float g, float* m,
                                           float* v) {
  const float m_new = AdamFma(h.beta1, *m, (1.0f - h.beta1) * g);
  const float v_new = AdamFma(h.beta2, *v, (1.0f - h.beta2) * g * g);
  *m = m_new;
  *v = v_new;
  return step_size * m_new / (sqrtf(v_new) + h.epsilon);
}

GRIDSYNC_HOST_DEVICE inline void AdamUpdate(const AdamHyper& h, float step_size, float g, float* w,
                                            float* m, float* v) {
  *w -= AdamStep(h, step_size, g, m, v);
}

// One row of `width` values with its own step count (the GPU kernels' unit
// of work): nothing when its gradient is all zero; otherwise the step count
// moves and every value takes an Adam step with gradient g * grad_scale.
// Returns whether the row was updated.
GRIDSYNC_HOST_DEVICE inline bool AdamUpdateRow(const AdamHyper& h, uint32_t width, const float* g,
                                               float grad_scale, float* w, float* m, float* v,
                                               uint32_t* step) {
  if (!RowHasGradient(g, width)) return false;
  const uint32_t t = *step + 1;
  *step = t;
  const float step_size = AdamStepSize(h, t);
  for (uint32_t f = 0; f < width; ++f)
    AdamUpdate(h, step_size, g[f] * grad_scale, &w[f], &m[f], &v[f]);
  return true;
}

}  // namespace gridsync
