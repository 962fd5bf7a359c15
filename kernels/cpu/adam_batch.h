// Adam on scattered rows of one table, vectorised across rows.
//
// A hash-grid row is 1 to 8 floats, so a row-at-a-time loop issues one
// scalar sqrt and one scalar divide per value, and those two bound sparse
// Adam. AdamRowBatch queues rows (their index, gradient and step size) and
// updates them 8 values at a time.
//
// Why explicit AVX2 rather than a loop left to the compiler: the earlier
// batch copied each row into lanes and trusted GCC to vectorise the update
// over them. GCC vectorised it in some inlined copies and not in others
// (the shard's and a stand-alone caller's ran scalar), and the copies in and
// out cost more than the update: 20 ns a row of 2 floats, in L1. Here a
// row's parameter and moments go straight from the table into a vector
// register (8/W rows per register) and back, and only the gradient and the
// step size are queued.
//
// Two uses (AdamBatchOut): kApply moves the parameters (w -= step), as
// Adam on a shard or in one process does; kNegatedStep leaves them alone
// and writes -step to a buffer, as the worker-side optimizer does (it
// pushes updates, and the shard's w + (-step) equals w - step exactly).
//
// Element by element the arithmetic is AdamUpdate's / AdamStep's
// (kernels/adam_math.h), with the same two fused multiply-adds, so the
// results are bit-identical to the row-at-a-time loops (adam_test checks
// both uses against them). Builds without AVX2 and FMA run the
// row-at-a-time arithmetic.
//
// Thread safety: one batch per thread. A batch holds indices into the rows
// it queued until Flush(); the caller must not touch those rows meanwhile
// (each row may be queued once per batch) and must Flush() before reading.
// Loads and stores of rows go through memcpy or intrinsics, never a cast
// pointer, so there is no aliasing question.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/adam_math.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__CUDACC__)
#include <immintrin.h>
#define GRIDSYNC_ADAM_AVX2 1
#endif

namespace gridsync::cpu {

enum class AdamBatchOut { kApply, kNegatedStep };

template <uint32_t W, AdamBatchOut Out = AdamBatchOut::kApply>
class AdamRowBatch {
  static_assert(W == 1 || W == 2 || W == 4 || W == 8, "hash-grid widths");
  static constexpr bool kApply = Out == AdamBatchOut::kApply;

 public:
  // Enough rows that the queued gradients were stored well before Flush
  // loads them as vectors (no store-to-load forwarding stalls), few enough
  // to stay in L1: at most 2 KiB of gradients.
  static constexpr uint32_t kRows = 64;
  static constexpr uint32_t kLanes = kRows * W;

  // m and v: the table's rows x W moments. target: with kApply the table's
  // parameters (rows x W), with kNegatedStep the buffer for -step.
  AdamRowBatch(const AdamHyper& hyper, float* target, float* m, float* v)
      : hyper_(hyper), target_(target), m_(m), v_(v) {}
  AdamRowBatch(const AdamRowBatch&) = delete;
  AdamRowBatch& operator=(const AdamRowBatch&) = delete;
  ~AdamRowBatch() = default;

  // Queues table row `row` with W gradient values g (each times grad_scale,
  // as the row-at-a-time loops pass them) and its step size; with
  // kNegatedStep, -step goes to target[out_at, out_at + W). Updates the
  // queued rows once kRows are queued.
  void Add(const float* g, float grad_scale, float step_size, uint64_t row, uint64_t out_at = 0) {
    float* lanes = g_ + rows_ * W;
    for (uint32_t f = 0; f < W; ++f) lanes[f] = g[f] * grad_scale;
    lr_[rows_] = step_size;
    at_[rows_] = row * W;
    if constexpr (!kApply) out_at_[rows_] = out_at;
    if (++rows_ == kRows) Flush();
  }

  // Updates the queued rows and writes them back.
  void Flush() {
    uint32_t r = 0;
#ifdef GRIDSYNC_ADAM_AVX2
    constexpr uint32_t kPerVector = 8 / W;
    if (rows_ >= kPerVector) {
      const Constants c(hyper_);
      for (; r + kPerVector <= rows_; r += kPerVector) UpdateVector(c, r);
    }
#endif
    for (; r < rows_; ++r) {
      for (uint32_t f = 0; f < W; ++f) {
        const uint64_t at = at_[r] + f;
        float* out = target_ + OutAt(r)[0] + f;
        if constexpr (kApply) {
          AdamUpdate(hyper_, lr_[r], g_[r * W + f], out, &m_[at], &v_[at]);
        } else {
          *out = -AdamStep(hyper_, lr_[r], g_[r * W + f], &m_[at], &v_[at]);
        }
      }
    }
    rows_ = 0;
  }

 private:
  // Where queued rows from `first` on go in target: with kApply, where
  // they are in m and v (the parameters have the same layout).
  const uint64_t* OutAt(uint32_t first) const { return (kApply ? at_ : out_at_) + first; }

#ifdef GRIDSYNC_ADAM_AVX2
  struct Constants {
    explicit Constants(const AdamHyper& h)
        : beta1(_mm256_set1_ps(h.beta1)),
          one_minus_beta1(_mm256_set1_ps(1.0f - h.beta1)),
          beta2(_mm256_set1_ps(h.beta2)),
          one_minus_beta2(_mm256_set1_ps(1.0f - h.beta2)),
          epsilon(_mm256_set1_ps(h.epsilon)),
          sign(_mm256_set1_ps(-0.0f)) {}
    __m256 beta1, one_minus_beta1, beta2, one_minus_beta2, epsilon, sign;
  };

  // The 8/W queued rows from `first` on, of `array` at the indices `at`.
  static __m256 Load(const uint64_t* at, const float* array) {
    if constexpr (W == 8) {
      return _mm256_loadu_ps(array + at[0]);
    } else if constexpr (W == 4) {
      return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(array + at[0])),
                                  _mm_loadu_ps(array + at[1]), 1);
    } else if constexpr (W == 2) {
      int64_t q[4];
      for (int i = 0; i < 4; ++i) std::memcpy(&q[i], array + at[i], sizeof(int64_t));
      return _mm256_castsi256_ps(_mm256_setr_epi64x(q[0], q[1], q[2], q[3]));
    } else {
      return _mm256_setr_ps(array[at[0]], array[at[1]], array[at[2]], array[at[3]], array[at[4]],
                            array[at[5]], array[at[6]], array[at[7]]);
    }
  }

  static void Store(const uint64_t* at, float* array, __m256 x) {
    if constexpr (W == 8) {
      _mm256_storeu_ps(array + at[0], x);
    } else if constexpr (W == 4) {
      _mm_storeu_ps(array + at[0], _mm256_castps256_ps128(x));
      _mm_storeu_ps(array + at[1], _mm256_extractf128_ps(x, 1));
    } else if constexpr (W == 2) {
      const __m128i lo = _mm_castps_si128(_mm256_castps256_ps128(x));
      const __m128i hi = _mm_castps_si128(_mm256_extractf128_ps(x, 1));
      const int64_t q[4] = {_mm_cvtsi128_si64(lo), _mm_extract_epi64(lo, 1), _mm_cvtsi128_si64(hi),
                            _mm_extract_epi64(hi, 1)};
      for (int i = 0; i < 4; ++i) std::memcpy(array + at[i], &q[i], sizeof(int64_t));
    } else {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, x);
      for (int i = 0; i < 8; ++i) array[at[i]] = lanes[i];
    }
  }

  // Each row's step size repeated over its W lanes.
  __m256 StepSizes(uint32_t first) const {
    if constexpr (W == 8) return _mm256_set1_ps(lr_[first]);
    if constexpr (W == 1) return _mm256_loadu_ps(lr_ + first);
    const __m256 four = _mm256_castps128_ps256(_mm_loadu_ps(lr_ + first));
    const __m256i spread = W == 2 ? _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)
                                  : _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    return _mm256_permutevar8x32_ps(four, spread);
  }

  // AdamUpdate (kApply) or -AdamStep (kNegatedStep) on 8 lanes: rows
  // [first, first + 8/W).
  void UpdateVector(const Constants& c, uint32_t first) {
    const uint64_t* at = at_ + first;
    const __m256 g = _mm256_load_ps(g_ + first * W);
    const __m256 m = _mm256_fmadd_ps(c.beta1, Load(at, m_), _mm256_mul_ps(c.one_minus_beta1, g));
    const __m256 v = _mm256_fmadd_ps(c.beta2, Load(at, v_),
                                     _mm256_mul_ps(_mm256_mul_ps(c.one_minus_beta2, g), g));
    const __m256 step = _mm256_div_ps(_mm256_mul_ps(StepSizes(first), m),
                                      _mm256_add_ps(_mm256_sqrt_ps(v), c.epsilon));
    Store(at, m_, m);
    Store(at, v_, v);
    const uint64_t* out_at = OutAt(first);
    if constexpr (kApply) {
      Store(out_at, target_, _mm256_sub_ps(Load(out_at, target_), step));
    } else {
      Store(out_at, target_, _mm256_xor_ps(step, c.sign));  // -x, as the scalar negation
    }
  }
#endif

  const AdamHyper hyper_;
  float* const target_;
  float* const m_;
  float* const v_;
  uint32_t rows_ = 0;
  alignas(64) float g_[kLanes] = {};
  float lr_[kRows + 4] = {};                  // StepSizes reads up to 4 from a row on
  uint64_t at_[kRows] = {};                   // index of each queued row's first value in m and v
  uint64_t out_at_[kApply ? 1 : kRows] = {};  // ... and in target (kNegatedStep)
};

}  // namespace gridsync::cpu
