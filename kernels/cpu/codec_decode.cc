// The CPU codecs' decoders (codec.h: cpu::Decode). Every value is checked
// with a cheap flag in the fast pass; the first offender is looked for
// (for the message) only once a payload is known bad.
//
// Thread safety: the free functions keep no state.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "common/counter_rng.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/codec_bytes.h"
#include "kernels/cpu/half.h"

namespace gridsync {
namespace {

using codec_bytes::CeilDiv;
using codec_bytes::FloatText;
using codec_bytes::LoadF32;
using codec_bytes::LoadU32;
using codec_bytes::Prefix;
using codec_math::BitsFloat;
using codec_math::FloatBits;
using codec_math::IsFiniteBits;

// ---------------------------------------------------------------------------
// Decoders.

Status NonFinite(const CodecOptions& options, const char* what, size_t i, float value) {
  return Status::Corruption(Prefix(options) + what + "[" + std::to_string(i) + "] is " +
                            FloatText(value) + "; allowed: finite values");
}

// True when some float's exponent is all ones (infinity or NaN).
bool AnyNonFinite(const float* x, size_t n) {
  size_t i = 0;
  bool bad = false;
#if defined(__AVX2__)
  const __m256i exp = _mm256_set1_epi32(static_cast<int32_t>(codec_math::kInfBits));
  __m256i vbad = _mm256_setzero_si256();
  for (; i + 8 <= n; i += 8) {
    const __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(x + i));
    vbad = _mm256_or_si256(vbad, _mm256_cmpeq_epi32(_mm256_and_si256(bits, exp), exp));
  }
  bad = !_mm256_testz_si256(vbad, vbad);
#endif
  for (; i < n; ++i) bad |= !IsFiniteBits(FloatBits(x[i]));
  return bad;
}

Status DecodeNone(const CodecOptions& options, const uint8_t* bytes, size_t n, float* out) {
  if (n > 0) std::memcpy(out, bytes, 4 * n);
  if (!AnyNonFinite(out, n)) return Status::OK();
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(out[i])) return NonFinite(options, "value", i, out[i]);
  return Status::OK();
}

// Halves to floats times scale (a power of two that keeps every finite
// half's product a normal float, so the product is exact). True when some
// half is infinity or NaN.
bool LoadHalves(const uint8_t* bytes, size_t n, float scale, float* out) {
  size_t i = 0;
  bool bad = false;
#if defined(__F16C__) && defined(__AVX2__)
  const __m128i exp_mask = _mm_set1_epi16(0x7C00);
  const __m256 vscale = _mm256_set1_ps(scale);
  __m128i vbad = _mm_setzero_si128();
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 2 * i));
    vbad = _mm_or_si128(vbad, _mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtph_ps(h), vscale));
  }
  bad = _mm_movemask_epi8(vbad) != 0;
#endif
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, 2);
    bad |= (h & 0x7C00u) == 0x7C00u;
    out[i] = HalfToFloat(h) * scale;
  }
  return bad;
}

Status DecodeFp16(const CodecOptions& options, const uint8_t* bytes, size_t n, float* out) {
  const uint32_t block = options.block;
  for (size_t begin = 0; begin < n; begin += block) {
    const size_t len = std::min<size_t>(block, n - begin);
    const size_t b = begin / block;
    const uint8_t* src = bytes + b * (2 * size_t{block} + 2);
    int16_t e;
    std::memcpy(&e, src, 2);
    if (e < codec_math::kFp16MinExponent || e > codec_math::kFp16MaxExponent) {
      return Status::Corruption(Prefix(options) + "block " + std::to_string(b) + " exponent " +
                                std::to_string(e) +
                                "; allowed: " + std::to_string(codec_math::kFp16MinExponent) +
                                ".." + std::to_string(codec_math::kFp16MaxExponent));
    }
    const uint8_t* halves = src + 2;
    if (!LoadHalves(halves, len, codec_math::Pow2(-e), out + begin)) continue;
    for (size_t i = 0; i < len; ++i) {
      uint16_t h;
      std::memcpy(&h, halves + 2 * i, 2);
      if ((h & 0x7C00u) != 0x7C00u) continue;
      char code[16];
      std::snprintf(code, sizeof(code), "0x%04x", h);
      return Status::Corruption(Prefix(options) + "value[" + std::to_string(begin + i) + "] is " +
                                code + " (" + ((h & 0x3FFu) != 0 ? "NaN" : "infinity") +
                                "); allowed: finite halves");
    }
  }
  return Status::OK();
}

Status DecodeBf16(const CodecOptions& options, const uint8_t* bytes, size_t n, float* out) {
  size_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m256i h =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 2 * i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(h, 16));
  }
#endif
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, 2);
    out[i] = codec_math::Bf16ToFloat(h);
  }
  if (!AnyNonFinite(out, n)) return Status::OK();
  for (i = 0; i < n; ++i)
    if (!std::isfinite(out[i])) return NonFinite(options, "value", i, out[i]);
  return Status::OK();
}

// A scale or norm: finite, >= 0, and small enough that `multiple` times it
// (the largest decoded magnitude) stays finite.
Status CheckScale(const CodecOptions& options, const std::string& what, float scale,
                  float multiple) {
  if (scale >= 0.0f && std::isfinite(scale * multiple)) return Status::OK();
  char limit[32];
  std::snprintf(limit, sizeof(limit), "%.9g", static_cast<double>(FLT_MAX / multiple));
  return Status::Corruption(Prefix(options) + what + " is " + FloatText(scale) +
                            "; allowed: finite, in [0, " + limit + "]" +
                            (std::isnan(scale) ? " (a NaN scale marks non-finite input)" : ""));
}

Status DecodeInt8(const CodecOptions& options, const uint8_t* bytes, size_t n, float* out) {
  const uint32_t block = options.block;
  for (size_t begin = 0; begin < n; begin += block) {
    const size_t len = std::min<size_t>(block, n - begin);
    const size_t b = begin / block;
    const uint8_t* src = bytes + b * (size_t{block} + 4);
    const float scale = LoadF32(src);
    GRIDSYNC_RETURN_IF_ERROR(
        CheckScale(options, "block " + std::to_string(b) + " scale", scale, 127.0f));
    const auto* q = reinterpret_cast<const int8_t*>(src + 4);
    float* y = out + begin;
    bool has_min = false;
    size_t i = 0;
#if defined(__AVX2__)
    const __m256 vscale = _mm256_set1_ps(scale);
    const __m128i lowest = _mm_set1_epi8(-128);
    __m128i vmin = _mm_setzero_si128();
    for (; i + 16 <= len; i += 16) {
      const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i));
      vmin = _mm_or_si128(vmin, _mm_cmpeq_epi8(codes, lowest));
      const __m256i lo = _mm256_cvtepi8_epi32(codes);
      const __m256i hi = _mm256_cvtepi8_epi32(_mm_srli_si128(codes, 8));
      _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), vscale));
      _mm256_storeu_ps(y + i + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), vscale));
    }
    has_min = _mm_movemask_epi8(vmin) != 0;
#endif
    for (; i < len; ++i) {
      has_min |= q[i] == -128;
      y[i] = static_cast<float>(q[i]) * scale;
    }
    if (has_min) {
      const size_t at = static_cast<size_t>(std::find(q, q + len, int8_t{-128}) - q);
      return Status::Corruption(Prefix(options) + "value[" + std::to_string(begin + at) +
                                "] has code -128; allowed: -127..127");
    }
  }
  return Status::OK();
}

Status DecodeQsgd(const CodecOptions& options, const uint8_t* bytes, size_t size, size_t n,
                  float* out) {
  const int bits = options.bits;
  const uint32_t s = (1u << bits) - 1;
  const float norm = LoadF32(bytes);
  GRIDSYNC_RETURN_IF_ERROR(CheckScale(options, "norm", norm, 1.0f));
  const float step = norm / static_cast<float>(s);
  if (!std::isfinite(step * static_cast<float>(s))) {
    return Status::Corruption(Prefix(options) + "norm " + FloatText(norm) +
                              " overflows when decoded; allowed: norm / s * s finite");
  }
  const uint32_t width = static_cast<uint32_t>(bits) + 1;
  const uint32_t level_mask = s;
  const uint8_t* codes = bytes + 4;
  const size_t code_bytes = size - 4;
  uint64_t acc = 0;
  uint32_t have = 0;
  size_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    while (have < width) {
      acc |= uint64_t{codes[next++]} << have;
      have += 8;
    }
    const uint32_t code = static_cast<uint32_t>(acc) & ((1u << width) - 1);
    acc >>= width;
    have -= width;
    const uint32_t level = code & level_mask;
    const bool negative = (code >> bits) != 0;
    if (negative && level == 0) {
      return Status::Corruption(Prefix(options) + "code[" + std::to_string(i) +
                                "] is a negative level 0; allowed: level 0 with sign 0, "
                                "levels 1.." +
                                std::to_string(s) + " with either sign");
    }
    const float magnitude = static_cast<float>(level) * step;
    out[i] = negative ? -magnitude : magnitude;
  }
  // Bits after the last code (in the last byte) must be zero.
  if (next < code_bytes || acc != 0) {
    return Status::Corruption(Prefix(options) + "padding bits after the last of " +
                              std::to_string(n) + " codes are not zero; allowed: zero");
  }
  return Status::OK();
}

Status DecodeOnebit(const CodecOptions& options, const uint8_t* bytes, size_t n, float* out) {
  const float scale = LoadF32(bytes);
  GRIDSYNC_RETURN_IF_ERROR(CheckScale(options, "scale", scale, 1.0f));
  const uint8_t* signs = bytes + 4;
  size_t i = 0;
#if defined(__AVX2__)
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 pos = _mm256_set1_ps(scale);
  const __m256 neg = _mm256_set1_ps(-scale);
  for (; i + 8 <= n; i += 8) {
    const __m256i byte = _mm256_set1_epi32(signs[i / 8]);
    const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(byte, bit), bit);
    _mm256_storeu_ps(out + i, _mm256_blendv_ps(neg, pos, _mm256_castsi256_ps(set)));
  }
#endif
  for (; i < n; ++i) out[i] = (signs[i / 8] >> (i % 8)) & 1u ? scale : -scale;
  if (n % 8 != 0 && (signs[n / 8] >> (n % 8)) != 0) {
    return Status::Corruption(Prefix(options) + "padding bits after the last of " +
                              std::to_string(n) + " signs are not zero; allowed: zero");
  }
  return Status::OK();
}

Status DecodeTopk(const CodecOptions& options, const uint8_t* bytes, size_t n, float* out) {
  const uint32_t k = KeptCount(options, n);
  const uint32_t sent_k = LoadU32(bytes);
  if (sent_k != k) {
    return Status::Corruption(Prefix(options) + "k is " + std::to_string(sent_k) + "; expected " +
                              std::to_string(k) + " for n = " + std::to_string(n) + " and ratio " +
                              std::to_string(options.ratio));
  }
  std::fill(out, out + n, 0.0f);
  const uint8_t* idx = bytes + 4;
  const uint8_t* val = bytes + 4 + 4 * size_t{k};
  int64_t previous = -1;
  for (uint32_t j = 0; j < k; ++j) {
    const uint32_t index = LoadU32(idx + 4 * size_t{j});
    if (index >= n) {
      return Status::Corruption(Prefix(options) + "index[" + std::to_string(j) +
                                "] = " + std::to_string(index) +
                                " is out of range; allowed: < n = " + std::to_string(n));
    }
    if (static_cast<int64_t>(index) <= previous) {
      return Status::Corruption(Prefix(options) + "index[" + std::to_string(j) +
                                "] = " + std::to_string(index) + " follows " +
                                std::to_string(previous) + "; indices must be strictly ascending");
    }
    previous = index;
    const float v = LoadF32(val + 4 * size_t{j});
    if (!std::isfinite(v)) return NonFinite(options, "value", j, v);
    out[index] = v;
  }
  return Status::OK();
}

Status DecodeRandomk(const CodecOptions& options, const uint8_t* bytes, size_t n, uint64_t seed,
                     float* out) {
  const uint32_t k = KeptCount(options, n);
  std::fill(out, out + n, 0.0f);
  if (k == 0) return Status::OK();
  std::vector<uint32_t> indices(k);
  cpu::RandomkIndices(seed, n, k, indices.data());
  const float factor = static_cast<float>(static_cast<double>(n) / static_cast<double>(k));
  for (uint32_t j = 0; j < k; ++j) {
    const float v = LoadF32(bytes + 4 * size_t{j});
    const float scaled = v * factor;
    if (!std::isfinite(scaled)) {
      if (!std::isfinite(v)) return NonFinite(options, "value", j, v);
      return Status::Corruption(Prefix(options) + "value[" + std::to_string(j) +
                                "] = " + FloatText(v) +
                                " overflows when scaled by n/k = " + std::to_string(factor) +
                                "; allowed: |value| <= " + std::to_string(FLT_MAX / factor));
    }
    out[indices[j]] = scaled;
  }
  return Status::OK();
}

}  // namespace

namespace cpu {

Status Decode(const CodecOptions& options, const uint8_t* bytes, size_t size, size_t n,
              uint64_t seed, float* out) {
  GRIDSYNC_RETURN_IF_ERROR(ValidateCodecOptions(options));
  if (n > kMaxCodecValues) {
    return Status::InvalidArgument(Prefix(options) + std::to_string(n) +
                                   " values; allowed: <= 4294967295");
  }
  if (n > 0 && out == nullptr) return Status::InvalidArgument(Prefix(options) + "out is null");
  GRIDSYNC_RETURN_IF_ERROR(CheckPayloadSize(options, size, n));
  if (size > 0 && bytes == nullptr)
    return Status::InvalidArgument(Prefix(options) + "bytes is null");
  switch (options.codec) {
    case Codec::kNone:
      return DecodeNone(options, bytes, n, out);
    case Codec::kFp16:
      return DecodeFp16(options, bytes, n, out);
    case Codec::kBf16:
      return DecodeBf16(options, bytes, n, out);
    case Codec::kInt8:
      return DecodeInt8(options, bytes, n, out);
    case Codec::kQsgd:
      return DecodeQsgd(options, bytes, size, n, out);
    case Codec::kOnebit:
      return DecodeOnebit(options, bytes, n, out);
    case Codec::kTopk:
      return DecodeTopk(options, bytes, n, out);
    case Codec::kRandomk:
      return DecodeRandomk(options, bytes, n, seed, out);
  }
  return Status::Internal("unreachable");
}

}  // namespace cpu
}  // namespace gridsync
