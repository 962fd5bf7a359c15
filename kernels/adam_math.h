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

// b^t by squaring, in double: multiplications only, each rounded to nearest
// by IEEE 754 on every CPU and GPU alike. powf would not do: its last bit is
// the library's choice (glibc's is within 1 ulp, CUDA documents 2), so the
// GPU's and the CPU's step sizes parted for some t, and with them Adam on a
// GPU worker and on a CPU shard (ps.optimizer). t < 2^32 takes at most 32
// squarings: a relative error below 2^-47, far under float's last bit.
// Opaque to the host compiler's optimiser (see GRIDSYNC_ADAM_OPAQUE), so
// that no caller's subtraction is fused with its last product.
#if defined(__CUDA_ARCH__)
#define GRIDSYNC_ADAM_OPAQUE
#elif defined(__clang__)
#define GRIDSYNC_ADAM_OPAQUE __attribute__((noinline))
#else
#define GRIDSYNC_ADAM_OPAQUE __attribute__((noipa))
#endif
GRIDSYNC_HOST_DEVICE GRIDSYNC_ADAM_OPAQUE inline double AdamPower(double b, uint32_t t) {
  double result = 1.0;
  for (; t != 0; t >>= 1) {
#ifdef __CUDA_ARCH__
    if (t & 1u) result = __dmul_rn(result, b);
    b = __dmul_rn(b, b);
#else
    if (t & 1u) result *= b;
    b *= b;
#endif
  }
  return result;
}

// The bias-corrected step size for a row at step t (t >= 1): the same bits
// on CPU and GPU (AdamPower, then operations IEEE rounds to nearest; the
// host compiler may fuse a product into an add, so none follows one here,
// and the device spells each one out), so the twins agree.
GRIDSYNC_HOST_DEVICE inline float AdamStepSize(const AdamHyper& h, uint32_t t) {
  const double b2 = AdamPower(h.beta2, t);
  const double b1 = AdamPower(h.beta1, t);
#ifdef __CUDA_ARCH__
  return static_cast<float>(
      __ddiv_rn(__dmul_rn(h.learning_rate, __dsqrt_rn(__dsub_rn(1.0, b2))), __dsub_rn(1.0, b1)));
#else
  return static_cast<float>(double{h.learning_rate} * std::sqrt(1.0 - b2) / (1.0 - b1));
#endif
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
