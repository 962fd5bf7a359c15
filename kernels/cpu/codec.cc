// CPU codecs (the reference; the format is documented in codec.h).
//
// Hot loops are written for AVX2 (behind __AVX2__, with scalar tails that
// compute exactly the same values, so results do not depend on the build's
// -march): onebit encode is one pass that packs signs and sums |x|; int8
// quantises one block at a time while it is in L1; fp16 uses F16C. Decoders
// check every value with a cheap flag in the fast pass and look for the
// first offender (for the message) only once a payload is known bad.
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
#include "kernels/cpu/half.h"

namespace gridsync {

static_assert(std::endian::native == std::endian::little,
              "codec payloads are little-endian and written with memcpy");

namespace {

using codec_math::BitsFloat;
using codec_math::FloatBits;
using codec_math::IsFiniteBits;

constexpr uint32_t kTopkSample = 4096;     // topk's threshold sample
constexpr uint64_t kTopkSampleSeed = 0x746f706b;  // fixed: the sample only affects speed
constexpr uint64_t kTopkSampleStream = 2;

void StoreU32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void StoreF32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }
uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

[[noreturn]] void EncodeCheckFailed(int line, const std::string& what) {
  internal::CheckFailed(__FILE__, line, "cpu::Encode: " + what);
}

std::string Prefix(const CodecOptions& options) {
  return "codec " + std::string(CodecName(options.codec)) + ": ";
}

std::string FloatText(float x) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.9g (bits 0x%08x)", static_cast<double>(x), FloatBits(x));
  return buf;
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

void EncodeFp16(const float* x, size_t n, uint8_t* out) {
  size_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256 half_max = _mm256_set1_ps(kHalfMax);
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(codec_math::kCanonicalNan));
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
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
    const uint16_t h = FloatToHalf(codec_math::PrepareForHalf(x[i]));
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
  if (n > 4 * size_t{kTopkSample}) {
    std::vector<uint32_t> sample(kTopkSample);
    for (uint32_t j = 0; j < kTopkSample; ++j) {
      const uint64_t r = CounterRandom(kTopkSampleSeed, kTopkSampleStream, j);
      sample[j] = codec_math::MagnitudeKey(x[codec_math::MulHi64(r, n)]);
    }
    const double expected = static_cast<double>(kTopkSample) * k / static_cast<double>(n);
    const size_t rank = std::min<size_t>(
        kTopkSample - 1, static_cast<size_t>(expected + 3.0 * std::sqrt(expected) + 2.0));
    std::nth_element(sample.begin(), sample.begin() + rank, sample.end(), std::greater<>());
    candidates.reserve(static_cast<size_t>(1.5 * rank * (static_cast<double>(n) / kTopkSample)) + 16);
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

Status DecodeFp16(const CodecOptions& options, const uint8_t* bytes, size_t n, float* out) {
  size_t i = 0;
  bool bad = false;
#if defined(__F16C__) && defined(__AVX2__)
  const __m128i exp_mask = _mm_set1_epi16(0x7C00);
  __m128i vbad = _mm_setzero_si128();
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 2 * i));
    vbad = _mm_or_si128(vbad, _mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  bad = _mm_movemask_epi8(vbad) != 0;
#endif
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, 2);
    bad |= (h & 0x7C00u) == 0x7C00u;
    out[i] = HalfToFloat(h);
  }
  if (!bad) return Status::OK();
  for (i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, 2);
    if ((h & 0x7C00u) == 0x7C00u) {
      char code[16];
      std::snprintf(code, sizeof(code), "0x%04x", h);
      return Status::Corruption(Prefix(options) + "value[" + std::to_string(i) + "] is " + code +
                                " (" + ((h & 0x3FFu) != 0 ? "NaN" : "infinity") +
                                "); allowed: finite halves");
    }
  }
  return Status::OK();
}

Status DecodeBf16(const CodecOptions& options, const uint8_t* bytes, size_t n, float* out) {
  size_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 2 * i)));
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
                                "levels 1.." + std::to_string(s) + " with either sign");
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
                              std::to_string(k) + " for n = " + std::to_string(n) +
                              " and ratio " + std::to_string(options.ratio));
  }
  std::fill(out, out + n, 0.0f);
  const uint8_t* idx = bytes + 4;
  const uint8_t* val = bytes + 4 + 4 * size_t{k};
  int64_t previous = -1;
  for (uint32_t j = 0; j < k; ++j) {
    const uint32_t index = LoadU32(idx + 4 * size_t{j});
    if (index >= n) {
      return Status::Corruption(Prefix(options) + "index[" + std::to_string(j) + "] = " +
                                std::to_string(index) + " is out of range; allowed: < n = " +
                                std::to_string(n));
    }
    if (static_cast<int64_t>(index) <= previous) {
      return Status::Corruption(Prefix(options) + "index[" + std::to_string(j) + "] = " +
                                std::to_string(index) + " follows " + std::to_string(previous) +
                                "; indices must be strictly ascending");
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
      return Status::Corruption(Prefix(options) + "value[" + std::to_string(j) + "] = " +
                                FloatText(v) + " overflows when scaled by n/k = " +
                                std::to_string(factor) + "; allowed: |value| <= " +
                                std::to_string(FLT_MAX / factor));
    }
    out[indices[j]] = scaled;
  }
  return Status::OK();
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
    case Codec::kFp16: return EncodeFp16(values, n, out);
    case Codec::kBf16: return EncodeBf16(values, n, out);
    case Codec::kInt8: return EncodeInt8(values, n, options.block, out);
    case Codec::kQsgd: return EncodeQsgd(values, n, options.bits, seed, out);
    case Codec::kOnebit: return EncodeOnebit(values, n, out);
    case Codec::kTopk: return EncodeTopk(values, n, KeptCount(options, n), out);
    case Codec::kRandomk: return EncodeRandomk(values, n, KeptCount(options, n), seed, out);
  }
}

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
    case Codec::kNone: return DecodeNone(options, bytes, n, out);
    case Codec::kFp16: return DecodeFp16(options, bytes, n, out);
    case Codec::kBf16: return DecodeBf16(options, bytes, n, out);
    case Codec::kInt8: return DecodeInt8(options, bytes, n, out);
    case Codec::kQsgd: return DecodeQsgd(options, bytes, size, n, out);
    case Codec::kOnebit: return DecodeOnebit(options, bytes, n, out);
    case Codec::kTopk: return DecodeTopk(options, bytes, n, out);
    case Codec::kRandomk: return DecodeRandomk(options, bytes, n, seed, out);
  }
  return Status::Internal("unreachable");
}

}  // namespace cpu
}  // namespace gridsync
