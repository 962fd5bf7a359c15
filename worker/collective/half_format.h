// The 16-bit float formats of Collective::AllReduceSumHalf: conversions and
// the rounded element-wise sum every CPU backend reduces with, so Local and
// Gloo round a partial sum the same way NCCL's ncclHalf/ncclBfloat16 do
// (round to nearest even; fp16 overflows to inf, bf16 saturates as the
// codecs do).
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/codec.h"
#include "kernels/cpu/half.h"
#include "worker/collective/collective.h"

namespace gridsync {

inline float HalfToFloat(HalfFormat format, uint16_t h) {
  return format == HalfFormat::kFp16 ? HalfToFloat(h) : codec_math::Bf16ToFloat(h);
}

inline uint16_t FloatToHalf(HalfFormat format, float f) {
  return format == HalfFormat::kFp16 ? FloatToHalf(f) : codec_math::FloatToBf16(f);
}

// out[i] = round(a[i] + b[i]); out may alias a or b.
inline void SumHalves(HalfFormat format, uint16_t* out, const uint16_t* a, const uint16_t* b,
                      size_t n) {
  for (size_t i = 0; i < n; ++i)
    out[i] = FloatToHalf(format, HalfToFloat(format, a[i]) + HalfToFloat(format, b[i]));
}

}  // namespace gridsync
