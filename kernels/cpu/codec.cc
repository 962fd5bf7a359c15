// CPU codecs (the reference; the format is documented in codec.h).
//
// Hot loops are written for AVX2 (behind __AVX2__, with scalar tails that
// compute exactly the same values, so results do not depend on the build's
// -march): onebit encode is one pass that packs signs and sums |x|; int8
// quantises one block at a time while it is in L1, as fp16 scales one;
// fp16 converts with F16C. Decoders check every value with a cheap flag in
// the fast pass and look for the first offender (for the message) only
// once a payload is known bad.
//
// Thread safety: the free functions keep no state; see codec.h for
// ErrorFeedback.
#include "kernels/cpu/codec.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "common/state_bytes.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "common/check.h"
#include "common/counter_rng.h"
#include "kernels/cpu/codec_bytes.h"
#include "kernels/cpu/half.h"

namespace gridsync {

static_assert(std::endian::native == std::endian::little,
              "codec payloads are little-endian and written with memcpy");

namespace {

using codec_math::BitsFloat;
using codec_math::FloatBits;
using codec_math::IsFiniteBits;

// topk's threshold sample: at most kTopkSample values, a quarter of a
// block's, for blocks of at least kTopkSampledValues values. A step's
// blocks are a grid level's rows on one shard, mostly under 16k values:
// with the sample only above 4 x 4096 (until 2026-12-07) each was ranked
// whole, every value's rank key made twice and nth_element run over all.
constexpr uint32_t kTopkSample = 4096;
constexpr size_t kTopkSampledValues = 1024;
constexpr uint64_t kTopkSampleSeed = 0x746f706b;  // fixed: the sample only affects speed
constexpr uint64_t kTopkSampleStream = 2;

using codec_bytes::CeilDiv;
using codec_bytes::FloatText;
using codec_bytes::LoadF32;
using codec_bytes::LoadU32;
using codec_bytes::Prefix;
using codec_bytes::StoreF32;
using codec_bytes::StoreU32;

[[noreturn]] void EncodeCheckFailed(int line, const std::string& what) {
  internal::CheckFailed(__FILE__, line, "cpu::Encode: " + what);
}

// ---------------------------------------------------------------------------
// Deterministic sums (codec_math::kReduceChunk documents the order).

enum class Reduce { kAbs, kSquare };

template <Reduce op>
double Term(float x) {
  const double d = static_cast<double>(x);
  if constexpr (op == Reduce::kAbs) {
    return std::fabs(d);
  } else {
    return d * d;  // exact
  }
}

double CombineLanes(double* lanes) {
  for (uint32_t stride = 1; stride < codec_math::kReduceLanes; stride *= 2) {
    for (uint32_t j = 0; j < codec_math::kReduceLanes; j += 2 * stride) lanes[j] += lanes[j + stride];
  }
  return lanes[0];
}

#if defined(__AVX2__)
template <Reduce op>
__m256d TermPd(__m128 x) {
  const __m256d d = _mm256_cvtps_pd(x);
  if constexpr (op == Reduce::kAbs) {
    return _mm256_andnot_pd(_mm256_set1_pd(-0.0), d);
  } else {
    return _mm256_mul_pd(d, d);
  }
}
#endif

// Sum of Term(x[i]) over one chunk (len <= kReduceChunk).
template <Reduce op>
double ChunkSum(const float* x, size_t len) {
  alignas(32) double lanes[codec_math::kReduceLanes] = {};
  size_t i = 0;
#if defined(__AVX2__)
  static_assert(codec_math::kReduceLanes == 16);
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  __m256d acc2 = _mm256_setzero_pd(), acc3 = _mm256_setzero_pd();
  for (; i + 16 <= len; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i);
    const __m256 b = _mm256_loadu_ps(x + i + 8);
    acc0 = _mm256_add_pd(acc0, TermPd<op>(_mm256_castps256_ps128(a)));
    acc1 = _mm256_add_pd(acc1, TermPd<op>(_mm256_extractf128_ps(a, 1)));
    acc2 = _mm256_add_pd(acc2, TermPd<op>(_mm256_castps256_ps128(b)));
    acc3 = _mm256_add_pd(acc3, TermPd<op>(_mm256_extractf128_ps(b, 1)));
  }
  _mm256_store_pd(lanes + 0, acc0);
  _mm256_store_pd(lanes + 4, acc1);
  _mm256_store_pd(lanes + 8, acc2);
  _mm256_store_pd(lanes + 12, acc3);
#endif
  for (; i < len; ++i) lanes[i % codec_math::kReduceLanes] += Term<op>(x[i]);
  return CombineLanes(lanes);
}

template <Reduce op>
double DeterministicSum(const float* x, size_t n) {
  double total = 0.0;
  for (size_t begin = 0; begin < n; begin += codec_math::kReduceChunk)
    total += ChunkSum<op>(x + begin, std::min<size_t>(codec_math::kReduceChunk, n - begin));
  return total;
}

// A scale or norm as written: non-finite becomes the canonical NaN.
float CanonicalScale(double value) {
  const float f = static_cast<float>(value);
  return std::isfinite(f) ? f : BitsFloat(codec_math::kCanonicalNan);
}

// ---------------------------------------------------------------------------
// Encoders.

// n values as halves of x * scale (scale a power of two, so the product
// is exact and the conversion rounds once). in_range: every value is finite
// and |x| * scale < 2^15, so nothing saturates or is NaN.
void StoreHalves(const float* x, size_t n, float scale, bool in_range, uint8_t* out) {
  size_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
  const __m256 vscale = _mm256_set1_ps(scale);
  if (in_range) {
    for (; i + 8 <= n; i += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i),
                       _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(x + i), vscale),
                                       _MM_FROUND_TO_NEAREST_INT));
    }
  }
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256 half_max = _mm256_set1_ps(kHalfMax);
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(codec_math::kCanonicalNan));
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vscale);
    const __m256 abs = _mm256_andnot_ps(sign_mask, v);
    const __m256 saturate = _mm256_and_ps(_mm256_cmp_ps(abs, half_max, _CMP_GT_OQ),
                                          _mm256_cmp_ps(abs, inf, _CMP_LT_OQ));
    v = _mm256_blendv_ps(v, _mm256_or_ps(_mm256_and_ps(v, sign_mask), half_max), saturate);
    v = _mm256_blendv_ps(v, nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < n; ++i) {
    const uint16_t h = FloatToHalf(codec_math::PrepareForHalf(x[i] * scale));
    std::memcpy(out + 2 * i, &h, 2);
  }
}

void EncodeBf16(const float* x, size_t n, uint8_t* out) {
  size_t i = 0;
#if defined(__AVX2__)
  // codec_math::FloatToBf16 on 8 lanes (abs fits 31 bits: signed compares).
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(static_cast<int32_t>(codec_math::kInfBits));
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i bias = _mm256_set1_epi32(0x7FFF);
  const __m256i low15 = _mm256_set1_epi32(0x7FFF);
  const __m256i inf16 = _mm256_set1_epi32(0x7F80);
  const __m256i sign16 = _mm256_set1_epi32(0x8000);
  const __m256i max16 = _mm256_set1_epi32(0x7F7F);
  const __m256i quiet16 = _mm256_set1_epi32(0x0040);
  for (; i + 16 <= n; i += 16) {
    __m256i half[2];
    for (int part = 0; part < 2; ++part) {
      const __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(x + i + 8 * part));
      const __m256i abs = _mm256_and_si256(bits, abs_mask);
      const __m256i high = _mm256_srli_epi32(bits, 16);
      const __m256i rounded = _mm256_srli_epi32(
          _mm256_add_epi32(_mm256_add_epi32(bits, bias), _mm256_and_si256(high, one)), 16);
      const __m256i saturated = _mm256_or_si256(_mm256_and_si256(high, sign16), max16);
      const __m256i quiet_nan = _mm256_or_si256(high, quiet16);
      const __m256i is_nan = _mm256_cmpgt_epi32(abs, inf);
      const __m256i overflow =
          _mm256_and_si256(_mm256_cmpgt_epi32(inf, abs),
                           _mm256_cmpeq_epi32(_mm256_and_si256(rounded, low15), inf16));
      __m256i h = _mm256_blendv_epi8(rounded, saturated, overflow);
      h = _mm256_blendv_epi8(h, quiet_nan, is_nan);
      half[part] = h;
    }
    // packus works per 128-bit lane; the permute restores value order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(half[0], half[1]),
                                                    _MM_SHUFFLE(3, 1, 2, 0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), packed);
  }
#endif
  for (; i < n; ++i) {
    const uint16_t h = codec_math::FloatToBf16(x[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

// Max |x| of a block, and whether it holds a non-finite value.
float BlockMax(const float* x, size_t len, bool* non_finite) {
  size_t i = 0;
  float max = 0.0f;
  bool bad = false;
#if defined(__AVX2__)
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256 flt_max = _mm256_set1_ps(FLT_MAX);
  __m256 vmax = _mm256_setzero_ps();
  __m256 vbad = _mm256_setzero_ps();
  for (; i + 8 <= len; i += 8) {
    const __m256 abs = _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + i));
    vmax = _mm256_max_ps(abs, vmax);  // a NaN lane keeps vmax
    vbad = _mm256_or_ps(vbad, _mm256_cmp_ps(abs, flt_max, _CMP_NLE_UQ));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  for (float lane : lanes) max = std::max(max, lane);
  bad = _mm256_movemask_ps(vbad) != 0;
#endif
  for (; i < len; ++i) {
    const float abs = std::fabs(x[i]);
    if (abs > max) max = abs;
    if (!(abs <= FLT_MAX)) bad = true;
  }
  *non_finite = bad;
  return max;
}

void QuantizeInt8(const float* x, size_t len, float inv, int8_t* q) {
  size_t i = 0;
#if defined(__AVX2__)
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i lowest = _mm256_set1_epi8(-127);
  for (; i + 32 <= len; i += 32) {
    // _mm256_cvtps_epi32 rounds with MXCSR: nearest even, as nearbyint.
    const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
    const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vinv));
    const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), vinv));
    const __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), vinv));
    // packs work per 128-bit lane; the permute restores value order.
    __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    bytes = _mm256_permutevar8x32_epi32(bytes, order);
    bytes = _mm256_max_epi8(bytes, lowest);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), bytes);
  }
#endif
  for (; i < len; ++i)
    q[i] = static_cast<int8_t>(codec_math::ClampInt8Code(codec_math::Int8Code(x[i], inv)));
}

void EncodeFp16(const float* x, size_t n, uint32_t block, uint8_t* out) {
  for (size_t begin = 0; begin < n; begin += block) {
    const size_t len = std::min<size_t>(block, n - begin);
    uint8_t* dst = out + (begin / block) * (2 * size_t{block} + 2);
    bool non_finite = false;
    const float max = BlockMax(x + begin, len, &non_finite);
    // A non-finite block keeps exponent 0: its infinities and NaNs travel
    // as such, and decode refuses them.
    const int32_t e = non_finite ? 0 : codec_math::Fp16BlockExponent(FloatBits(max));
    const auto e16 = static_cast<int16_t>(e);
    std::memcpy(dst, &e16, 2);
    // Only the clamp at float's top end (e = -112) can leave the block's
    // largest at or above 2^15, where it may saturate.
    const bool in_range = !non_finite && e > codec_math::kFp16MinExponent;
    StoreHalves(x + begin, len, codec_math::Pow2(e), in_range, dst + 2);
  }
}

void EncodeInt8(const float* x, size_t n, uint32_t block, uint8_t* out) {
  for (size_t begin = 0; begin < n; begin += block) {
    const size_t len = std::min<size_t>(block, n - begin);
    const float* v = x + begin;
    uint8_t* dst = out + (begin / block) * (size_t{block} + 4);
    auto* q = reinterpret_cast<int8_t*>(dst + 4);
    bool non_finite = false;
    const float max = BlockMax(v, len, &non_finite);
    if (non_finite || max == 0.0f) {
      StoreU32(dst, non_finite ? codec_math::kCanonicalNan : 0u);
      std::memset(q, 0, len);
      continue;
    }
    StoreF32(dst, max / 127.0f);
    const float inv = 127.0f / max;
    if (std::isfinite(inv)) {
      QuantizeInt8(v, len, inv, q);
    } else {
      const double wide = 127.0 / static_cast<double>(max);
      for (size_t i = 0; i < len; ++i)
        q[i] = static_cast<int8_t>(codec_math::ClampInt8Code(codec_math::Int8CodeWide(v[i], wide)));
    }
  }
}

// One pass: sign bits and the deterministic sum of |x|.
void EncodeOnebit(const float* x, size_t n, uint8_t* out) {
  uint8_t* signs = out + 4;
  std::memset(signs, 0, CeilDiv(n, 8));
  double total = 0.0;
  for (size_t begin = 0; begin < n; begin += codec_math::kReduceChunk) {
    const size_t len = std::min<size_t>(codec_math::kReduceChunk, n - begin);
    const float* v = x + begin;
    uint8_t* s = signs + begin / 8;  // chunks start on a byte
    alignas(32) double lanes[codec_math::kReduceLanes] = {};
    size_t i = 0;
#if defined(__AVX2__)
    const __m256 zero = _mm256_setzero_ps();
    __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
    __m256d acc2 = _mm256_setzero_pd(), acc3 = _mm256_setzero_pd();
    for (; i + 16 <= len; i += 16) {
      const __m256 a = _mm256_loadu_ps(v + i);
      const __m256 b = _mm256_loadu_ps(v + i + 8);
      s[i / 8] = static_cast<uint8_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, zero, _CMP_GE_OQ)));
      s[i / 8 + 1] = static_cast<uint8_t>(_mm256_movemask_ps(_mm256_cmp_ps(b, zero, _CMP_GE_OQ)));
      acc0 = _mm256_add_pd(acc0, TermPd<Reduce::kAbs>(_mm256_castps256_ps128(a)));
      acc1 = _mm256_add_pd(acc1, TermPd<Reduce::kAbs>(_mm256_extractf128_ps(a, 1)));
      acc2 = _mm256_add_pd(acc2, TermPd<Reduce::kAbs>(_mm256_castps256_ps128(b)));
      acc3 = _mm256_add_pd(acc3, TermPd<Reduce::kAbs>(_mm256_extractf128_ps(b, 1)));
    }
    _mm256_store_pd(lanes + 0, acc0);
    _mm256_store_pd(lanes + 4, acc1);
    _mm256_store_pd(lanes + 8, acc2);
    _mm256_store_pd(lanes + 12, acc3);
#endif
    for (; i < len; ++i) {
      lanes[i % codec_math::kReduceLanes] += Term<Reduce::kAbs>(v[i]);
      if (v[i] >= 0.0f) s[i / 8] = static_cast<uint8_t>(s[i / 8] | (1u << (i % 8)));
    }
    total += CombineLanes(lanes);
  }
  StoreF32(out, n == 0 ? 0.0f : CanonicalScale(total / static_cast<double>(n)));
}

// Appends `width`-bit codes LSB first.
class BitWriter {
 public:
  explicit BitWriter(uint8_t* out) : out_(out) {}
  void Put(uint32_t code, uint32_t width) {
    acc_ |= uint64_t{code} << used_;
    used_ += width;
    while (used_ >= 8) {
      *out_++ = static_cast<uint8_t>(acc_);
      acc_ >>= 8;
      used_ -= 8;
    }
  }
  void Flush() {
    if (used_ > 0) *out_++ = static_cast<uint8_t>(acc_);
    acc_ = 0;
    used_ = 0;
  }

 private:
  uint8_t* out_;
  uint64_t acc_ = 0;
  uint32_t used_ = 0;
};

void EncodeQsgd(const float* x, size_t n, int bits, uint64_t seed, uint8_t* out) {
  const float norm = CanonicalScale(std::sqrt(DeterministicSum<Reduce::kSquare>(x, n)));
  StoreF32(out, norm);
  const uint32_t width = static_cast<uint32_t>(bits) + 1;
  const uint32_t s = (1u << bits) - 1;
  BitWriter writer(out + 4);
  if (!(norm > 0.0f) || !std::isfinite(norm)) {
    for (size_t i = 0; i < n; ++i) writer.Put(0, width);
    writer.Flush();
    return;
  }
  const double inv = static_cast<double>(s) / static_cast<double>(norm);
  const uint64_t key = codec_math::RandomKey(seed, codec_math::kQsgdStream);
  for (size_t i = 0; i < n; ++i) {
    double r = std::fabs(static_cast<double>(x[i])) * inv;
    if (r > s) r = s;
    const uint32_t level = codec_math::QsgdLevel(r, codec_math::RandomAt(key, i));
    const uint32_t sign = (level != 0 && x[i] < 0.0f) ? 1u : 0u;
    writer.Put(level | (sign << bits), width);
  }
  writer.Flush();
}

// Order of topk: larger |x| first, then lower index. Packing both into one
// u64 makes every element's rank key distinct.
uint64_t TopkRank(const float* x, size_t i) {
  return (uint64_t{codec_math::MagnitudeKey(x[i])} << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}

// Indices (ascending) of the candidates with MagnitudeKey >= threshold.
void CollectCandidates(const float* x, size_t n, uint32_t threshold, std::vector<uint32_t>* out) {
  size_t i = 0;
#if defined(__AVX2__)
  // Keys fit in 31 bits, so signed compares order them; threshold-1 >= -1.
  const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(threshold) - 1);
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  for (; i + 8 <= n; i += 8) {
    const __m256i keys = _mm256_and_si256(
        _mm256_castps_si256(_mm256_loadu_ps(x + i)), abs_mask);
    unsigned mask = static_cast<unsigned>(
        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(keys, below))));
    while (mask != 0) {
      out->push_back(static_cast<uint32_t>(i) + static_cast<uint32_t>(std::countr_zero(mask)));
      mask &= mask - 1;
    }
  }
#endif
  for (; i < n; ++i)
    if (codec_math::MagnitudeKey(x[i]) >= threshold) out->push_back(static_cast<uint32_t>(i));
}

// The k top-ranked indices, ascending: a threshold estimated from a sample
// keeps ~k(1 + a few sigma) candidates; the exact k-th rank among them (or,
// when the sample misjudged and fewer than k passed, among all values) is
// found with nth_element.
void TopkSelect(const float* x, size_t n, uint32_t k, uint32_t* indices) {
  if (k == 0) return;
  if (k == n) {
    std::iota(indices, indices + k, 0u);
    return;
  }
  std::vector<uint32_t> candidates;
  bool use_candidates = false;
  if (n >= kTopkSampledValues) {
    const auto samples = static_cast<uint32_t>(std::min<size_t>(kTopkSample, n / 4));
    std::vector<uint32_t> sample(samples);
    for (uint32_t j = 0; j < samples; ++j) {
      const uint64_t r = CounterRandom(kTopkSampleSeed, kTopkSampleStream, j);
      sample[j] = codec_math::MagnitudeKey(x[codec_math::MulHi64(r, n)]);
    }
    const double expected = static_cast<double>(samples) * k / static_cast<double>(n);
    const size_t rank = std::min<size_t>(
        samples - 1, static_cast<size_t>(expected + 3.0 * std::sqrt(expected) + 2.0));
    std::nth_element(sample.begin(), sample.begin() + rank, sample.end(), std::greater<>());
    candidates.reserve(static_cast<size_t>(1.5 * rank * (static_cast<double>(n) / samples)) + 16);
    CollectCandidates(x, n, sample[rank], &candidates);
    use_candidates = candidates.size() >= k;
  }
  const size_t count = use_candidates ? candidates.size() : n;
  if (count == k) {
    std::copy(candidates.begin(), candidates.end(), indices);
    return;
  }
  std::vector<uint64_t> ranks(count);
  for (size_t j = 0; j < count; ++j) ranks[j] = TopkRank(x, use_candidates ? candidates[j] : j);
  std::nth_element(ranks.begin(), ranks.begin() + (k - 1), ranks.end(), std::greater<>());
  const uint64_t boundary = ranks[k - 1];
  uint32_t written = 0;
  for (size_t j = 0; j < count; ++j) {
    const size_t i = use_candidates ? candidates[j] : j;
    if (TopkRank(x, i) >= boundary) indices[written++] = static_cast<uint32_t>(i);
  }
  GRIDSYNC_CHECK_EQ(written, k);
}

void EncodeTopk(const float* x, size_t n, uint32_t k, uint8_t* out) {
  StoreU32(out, k);
  std::vector<uint32_t> indices(k);
  TopkSelect(x, n, k, indices.data());
  uint8_t* idx_out = out + 4;
  uint8_t* val_out = out + 4 + 4 * size_t{k};
  for (uint32_t j = 0; j < k; ++j) {
    StoreU32(idx_out + 4 * size_t{j}, indices[j]);
    StoreF32(val_out + 4 * size_t{j}, x[indices[j]]);
  }
}

void EncodeRandomk(const float* x, size_t n, uint32_t k, uint64_t seed, uint8_t* out) {
  std::vector<uint32_t> indices(k);
  cpu::RandomkIndices(seed, n, k, indices.data());
  for (uint32_t j = 0; j < k; ++j) StoreF32(out + 4 * size_t{j}, x[indices[j]]);
}

}  // namespace

namespace cpu {

void RandomkIndices(uint64_t seed, size_t n, uint32_t k, uint32_t* indices) {
  GRIDSYNC_CHECK_LE(n, kMaxCodecValues);
  GRIDSYNC_CHECK_LE(size_t{k}, n);
  if (k == 0) return;
  std::vector<uint64_t> taken(CeilDiv(n, 64), 0);
  auto test = [&](uint64_t i) { return (taken[i / 64] >> (i % 64)) & 1u; };
  auto set = [&](uint64_t i) { taken[i / 64] |= uint64_t{1} << (i % 64); };
  // Floyd: for j = n-k .. n-1 draw t in [0, j]; take t, or j if t is taken.
  const uint64_t key = codec_math::RandomKey(seed, codec_math::kRandomkStream);
  for (uint64_t j = n - k; j < n; ++j) {
    const uint64_t t = codec_math::MulHi64(codec_math::RandomAt(key, j), j + 1);
    set(test(t) ? j : t);
  }
  uint32_t written = 0;
  for (size_t w = 0; w < taken.size(); ++w) {
    for (uint64_t word = taken[w]; word != 0; word &= word - 1)
      indices[written++] = static_cast<uint32_t>(w * 64 + std::countr_zero(word));
  }
  GRIDSYNC_CHECK_EQ(written, k);
}

void Encode(const CodecOptions& options, const float* values, size_t n, uint64_t seed,
            uint8_t* out) {
  const Status valid = ValidateCodecOptions(options);
  if (!valid.ok()) EncodeCheckFailed(__LINE__, valid.ToString());
  if (n > kMaxCodecValues)
    EncodeCheckFailed(__LINE__, std::to_string(n) + " values; allowed: <= 2^32 - 1");
  if (n > 0 && values == nullptr) EncodeCheckFailed(__LINE__, "values is null");
  if (EncodedSize(options, n) > 0 && out == nullptr) EncodeCheckFailed(__LINE__, "out is null");
  switch (options.codec) {
    case Codec::kNone:
      if (n > 0) std::memcpy(out, values, 4 * n);
      return;
    case Codec::kFp16:
      return EncodeFp16(values, n, options.block, out);
    case Codec::kBf16: return EncodeBf16(values, n, out);
    case Codec::kInt8: return EncodeInt8(values, n, options.block, out);
    case Codec::kQsgd: return EncodeQsgd(values, n, options.bits, seed, out);
    case Codec::kOnebit: return EncodeOnebit(values, n, out);
    case Codec::kTopk: return EncodeTopk(values, n, KeptCount(options, n), out);
    case Codec::kRandomk: return EncodeRandomk(values, n, KeptCount(options, n), seed, out);
  }
}

}  // namespace cpu
}  // namespace gridsync