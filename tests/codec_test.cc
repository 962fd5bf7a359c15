// The CPU gradient codecs (kernels/cpu/codec.h): names and options, exact
// wire sizes, round trips with each codec's error bound, topk against a full
// sort (ties included), unbiasedness of qsgd and randomk over many seeds,
// every class of malformed payload, and a random-bytes fuzz of Decode.
#include "kernels/cpu/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/counter_rng.h"
#include "tests/codec_test_util.h"

namespace gridsync {
namespace {

constexpr size_t kSizes[] = {1, 7, 256, 1000, 100003};

using codec_testing::Contains;
using codec_testing::DecodeVec;
using codec_testing::EncodeVec;
using codec_testing::Gaussian;
using codec_testing::LoadF32;
using codec_testing::LoadU32;
using codec_testing::Options;
using codec_testing::StoreF32;
using codec_testing::StoreU32;

size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// The documented sizes, written out independently of EncodedSize.
size_t DocumentedSize(const CodecOptions& o, size_t n) {
  const size_t k = n == 0 ? 0
                          : std::clamp<size_t>(static_cast<size_t>(std::llround(o.ratio * n)),
                                               1, n);
  switch (o.codec) {
    case Codec::kNone: return 4 * n;
    case Codec::kFp16:
      return 2 * CeilDiv(n, o.block) + 2 * n;
    case Codec::kBf16: return 2 * n;
    case Codec::kInt8: return 4 * CeilDiv(n, o.block) + n;
    case Codec::kQsgd: return 4 + CeilDiv(n * (o.bits + 1), 8);
    case Codec::kOnebit: return 4 + CeilDiv(n, 8);
    case Codec::kTopk: return 4 + 8 * k;
    case Codec::kRandomk: return 4 * k;
  }
  return 0;
}

// The reference top-k: a full stable sort by |x| (ties keep index order),
// the first k, ascending.
std::vector<uint32_t> ReferenceTopk(const std::vector<float>& x, size_t k) {
  std::vector<uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<uint32_t> TopkIndicesOf(const std::vector<uint8_t>& payload) {
  const uint32_t k = LoadU32(payload.data());
  std::vector<uint32_t> out(k);
  for (uint32_t j = 0; j < k; ++j) out[j] = LoadU32(payload.data() + 4 + 4 * size_t{j});
  return out;
}

// ---------------------------------------------------------------------------
// Names, options, sizes.

TEST(CodecNames, RoundTripAndUnknown) {
  const char* names[] = {"none", "fp16", "bf16", "int8", "qsgd", "onebit", "topk", "randomk"};
  for (size_t i = 0; i < std::size(kAllCodecs); ++i) {
    EXPECT_EQ(CodecName(kAllCodecs[i]), names[i]);
    EXPECT_EQ(static_cast<size_t>(kAllCodecs[i]), i);
    Result<Codec> parsed = ParseCodec(names[i]);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, kAllCodecs[i]);
    std::ostringstream os;
    os << kAllCodecs[i];
    EXPECT_EQ(os.str(), names[i]);
  }
  Result<Codec> bad = ParseCodec("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad.status().message(), "\"fp8\""));
  EXPECT_TRUE(Contains(bad.status().message(),
                       "allowed: none, fp16, bf16, int8, qsgd, onebit, topk, randomk"));
  EXPECT_FALSE(ParseCodec("FP16").ok());
  EXPECT_FALSE(ParseCodec("").ok());
}

TEST(CodecOptionsTest, ValidationNamesFieldAndRange) {
  for (Codec codec : kAllCodecs) EXPECT_TRUE(ValidateCodecOptions(Options(codec)).ok()) << codec;
  struct Bad {
    CodecOptions options;
    const char* message;
  };
  CodecOptions qsgd0 = Options(Codec::kQsgd);
  qsgd0.bits = 0;
  CodecOptions qsgd9 = Options(Codec::kQsgd);
  qsgd9.bits = 9;
  CodecOptions int8 = Options(Codec::kInt8);
  int8.block = 0;
  CodecOptions fp16 = Options(Codec::kFp16);
  fp16.block = 0;
  CodecOptions topk0 = Options(Codec::kTopk);
  topk0.ratio = 0.0;
  CodecOptions topk_big = Options(Codec::kTopk);
  topk_big.ratio = 1.5;
  CodecOptions randomk_nan = Options(Codec::kRandomk);
  randomk_nan.ratio = std::nan("");
  CodecOptions randomk_neg = Options(Codec::kRandomk);
  randomk_neg.ratio = -0.1;
  CodecOptions unknown = Options(static_cast<Codec>(200));
  const Bad bad[] = {{qsgd0, "bits 0; allowed: 1..8"},
                     {qsgd9, "bits 9; allowed: 1..8"},
                     {int8, "int8: block 0; allowed: >= 1"},
                     {fp16, "fp16: block 0; allowed: >= 1"},
                     {topk0, "allowed: (0, 1]"},
                     {topk_big, "allowed: (0, 1]"},
                     {randomk_nan, "allowed: (0, 1]"},
                     {randomk_neg, "allowed: (0, 1]"},
                     {unknown, "codec 200 unknown"}};
  for (const Bad& b : bad) {
    const Status status = ValidateCodecOptions(b.options);
    ASSERT_FALSE(status.ok()) << b.message;
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(status.message(), b.message)) << status.message();
    // Decode refuses them too, before reading a byte.
    float out = 0.0f;
    EXPECT_EQ(cpu::Decode(b.options, nullptr, 0, 1, 0, &out).code(),
              StatusCode::kInvalidArgument);
  }
  // Fields a codec does not use are not judged.
  CodecOptions bf16 = Options(Codec::kBf16);
  bf16.bits = 0;
  bf16.ratio = 7.0;
  bf16.block = 0;
  EXPECT_TRUE(ValidateCodecOptions(bf16).ok());
}

TEST(CodecSizes, KeptCount) {
  CodecOptions topk = Options(Codec::kTopk);  // ratio 0.01
  EXPECT_EQ(KeptCount(topk, 0), 0u);
  EXPECT_EQ(KeptCount(topk, 1), 1u);
  EXPECT_EQ(KeptCount(topk, 7), 1u);
  EXPECT_EQ(KeptCount(topk, 256), 3u);      // 2.56
  EXPECT_EQ(KeptCount(topk, 1000), 10u);
  EXPECT_EQ(KeptCount(topk, 100003), 1000u);
  topk.ratio = 0.5;
  EXPECT_EQ(KeptCount(topk, 7), 4u);  // 3.5 rounds away from zero
  topk.ratio = 1.0;
  EXPECT_EQ(KeptCount(topk, 100003), 100003u);
  EXPECT_EQ(KeptCount(Options(Codec::kOnebit), 1234), 1234u);
}

TEST(CodecSizes, ExactBytesForEveryCodec) {
  // A few written out by hand (defaults: ratio 0.01, bits 4, block 256).
  EXPECT_EQ(EncodedSize(Options(Codec::kNone), 7), 28u);
  EXPECT_EQ(EncodedSize(Options(Codec::kFp16), 7), 2u + 14);
  EXPECT_EQ(EncodedSize(Options(Codec::kFp16), 257), 2u * 2 + 514);
  EXPECT_EQ(EncodedSize(Options(Codec::kBf16), 1000), 2000u);
  EXPECT_EQ(EncodedSize(Options(Codec::kInt8), 1000), 4u * 4 + 1000);
  EXPECT_EQ(EncodedSize(Options(Codec::kInt8), 256), 260u);
  EXPECT_EQ(EncodedSize(Options(Codec::kQsgd), 7), 4u + 5);  // 35 bits
  EXPECT_EQ(EncodedSize(Options(Codec::kOnebit), 7), 5u);
  EXPECT_EQ(EncodedSize(Options(Codec::kOnebit), 256), 36u);
  EXPECT_EQ(EncodedSize(Options(Codec::kTopk), 1000), 4u + 80);
  EXPECT_EQ(EncodedSize(Options(Codec::kRandomk), 100003), 4000u);
  for (Codec codec : kAllCodecs) {
    for (int bits : {1, 4, 8}) {
      for (uint32_t block : {1u, 7u, 256u}) {
        for (double ratio : {0.001, 0.01, 0.3, 1.0}) {
          CodecOptions o = Options(codec);
          o.bits = bits;
          o.block = block;
          o.ratio = ratio;
          for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{256}, size_t{1000},
                           size_t{100003}}) {
            ASSERT_EQ(EncodedSize(o, n), DocumentedSize(o, n))
                << codec << " n " << n << " bits " << bits << " block " << block;
          }
        }
      }
    }
  }
}

TEST(CodecMath, CounterRandomMatchesCommon) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, ~uint64_t{0}}) {
    for (uint64_t stream : {uint64_t{0}, uint64_t{1}, uint64_t{7}}) {
      const uint64_t key = codec_math::RandomKey(seed, stream);
      for (uint64_t i = 0; i < 1000; ++i)
        ASSERT_EQ(codec_math::RandomAt(key, i), CounterRandom(seed, stream, i));
    }
  }
  // MulHi64 against a 128-bit product.
  std::mt19937_64 rng(3);
  for (int t = 0; t < 10000; ++t) {
    const uint64_t a = rng(), b = rng();
    __extension__ using U128 = unsigned __int128;
    ASSERT_EQ(codec_math::MulHi64(a, b), static_cast<uint64_t>((U128{a} * b) >> 64));
  }
}

// ---------------------------------------------------------------------------
// Round trips for every codec and size.

class CodecRoundTrip : public testing::TestWithParam<std::tuple<Codec, size_t>> {};

TEST_P(CodecRoundTrip, SizeDeterminismAndErrorBound) {
  const auto [codec, n] = GetParam();
  CodecOptions o = Options(codec);
  o.ratio = 0.1;
  const std::vector<float> x = Gaussian(n, 1000 + n, 0.5f);
  const uint64_t seed = 0x5eed + n;
  const std::vector<uint8_t> bytes = EncodeVec(o, x, seed);
  ASSERT_EQ(bytes.size(), DocumentedSize(o, n));
  // Deterministic, and independent of the output's alignment.
  EXPECT_EQ(EncodeVec(o, x, seed), bytes);
  std::vector<uint8_t> shifted(bytes.size() + 1);
  cpu::Encode(o, x.data(), n, seed, shifted.data() + 1);
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), shifted.begin() + 1));

  std::vector<float> y;
  const Status status = DecodeVec(o, bytes, n, seed, &y);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_EQ(y.size(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(y[i])) << codec << " output " << i;

  size_t bad = 0;
  auto expect = [&](bool ok, size_t i, float bound) {
    if (ok) return;
    if (++bad <= 5)
      ADD_FAILURE() << codec << " n " << n << " [" << i << "]: x " << x[i] << " decoded " << y[i]
                    << " bound " << bound;
  };
  switch (codec) {
    case Codec::kNone:
      for (size_t i = 0; i < n; ++i) expect(std::bit_cast<uint32_t>(x[i]) == std::bit_cast<uint32_t>(y[i]), i, 0);
      break;
    case Codec::kFp16:
      // Half's relative rounding, and its subnormal step 2^-24 of the
      // block's largest |x| brought to [2^14, 2^15).
      for (size_t i = 0; i < n; ++i) {
        const size_t begin = i / o.block * o.block;
        float max = 0.0f;
        for (size_t j = begin; j < std::min<size_t>(n, begin + o.block); ++j)
          max = std::max(max, std::fabs(x[j]));
        const float bound = std::ldexp(std::fabs(x[i]), -11) + std::ldexp(max, -38);
        expect(std::fabs(y[i] - x[i]) <= bound, i, bound);
      }
      break;
    case Codec::kBf16:
      for (size_t i = 0; i < n; ++i) {
        const float bound = std::ldexp(std::fabs(x[i]), -8);
        expect(std::fabs(y[i] - x[i]) <= bound, i, bound);
      }
      break;
    case Codec::kInt8:
      for (size_t i = 0; i < n; ++i) {
        const float scale = LoadF32(bytes.data() + (i / o.block) * (o.block + 4));
        const float bound = 0.5f * scale * (1.0f + 1e-5f) + 1e-6f * std::fabs(x[i]);
        expect(std::fabs(y[i] - x[i]) <= bound, i, bound);
      }
      break;
    case Codec::kQsgd: {
      const float norm = LoadF32(bytes.data());
      const float step = norm / 15.0f;
      for (size_t i = 0; i < n; ++i) {
        const float bound = step * (1.0f + 1e-5f);
        expect(std::fabs(y[i] - x[i]) <= bound && (y[i] == 0.0f || (y[i] < 0) == (x[i] < 0)), i,
               bound);
      }
      break;
    }
    case Codec::kOnebit: {
      double sum = 0;
      for (float v : x) sum += std::fabs(v);
      const float scale = static_cast<float>(sum / n);
      EXPECT_NEAR(LoadF32(bytes.data()), scale, 1e-6f * scale);
      for (size_t i = 0; i < n; ++i)
        expect(y[i] == (x[i] >= 0.0f ? 1.0f : -1.0f) * LoadF32(bytes.data()), i, 0);
      break;
    }
    case Codec::kTopk: {
      const std::vector<uint32_t> want = ReferenceTopk(x, KeptCount(o, n));
      EXPECT_EQ(TopkIndicesOf(bytes), want);
      std::vector<bool> kept(n, false);
      for (uint32_t i : want) kept[i] = true;
      for (size_t i = 0; i < n; ++i) expect(y[i] == (kept[i] ? x[i] : 0.0f), i, 0);
      break;
    }
    case Codec::kRandomk: {
      const uint32_t k = KeptCount(o, n);
      std::vector<uint32_t> indices(k);
      cpu::RandomkIndices(seed, n, k, indices.data());
      std::vector<bool> kept(n, false);
      for (uint32_t i : indices) kept[i] = true;
      const float factor = static_cast<float>(static_cast<double>(n) / k);
      size_t nonzero = 0;
      for (size_t i = 0; i < n; ++i) {
        expect(y[i] == (kept[i] ? x[i] * factor : 0.0f), i, 0);
        nonzero += y[i] != 0.0f;
      }
      EXPECT_EQ(nonzero, k);
      break;
    }
  }
  EXPECT_EQ(bad, 0u) << codec << " n " << n;
}

std::string RoundTripName(const testing::TestParamInfo<CodecRoundTrip::ParamType>& param) {
  return std::string(CodecName(std::get<0>(param.param))) + "_n" +
         std::to_string(std::get<1>(param.param));
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecRoundTrip,
                         testing::Combine(testing::ValuesIn(kAllCodecs), testing::ValuesIn(kSizes)),
                         RoundTripName);

TEST(CodecRoundTrip, EmptyArrays) {
  for (Codec codec : kAllCodecs) {
    const CodecOptions o = Options(codec);
    const std::vector<uint8_t> bytes = EncodeVec(o, {}, 1);
    EXPECT_EQ(bytes.size(), DocumentedSize(o, 0)) << codec;
    std::vector<float> y;
    EXPECT_TRUE(DecodeVec(o, bytes, 0, 1, &y).ok()) << codec;
  }
}

// ---------------------------------------------------------------------------
// Per-codec details.

// The exponent of a block, read from its first two bytes.
int16_t BlockExponent(const std::vector<uint8_t>& bytes, const CodecOptions& o, size_t block) {
  int16_t e;
  std::memcpy(&e, bytes.data() + block * (2 * o.block + 2), 2);
  return e;
}

TEST(Fp16Codec, ScalesEachBlockByAPowerOfTwo) {
  CodecOptions o = Options(Codec::kFp16);
  o.block = 2;
  // Blocks: {1, -0.5}, {3e-9, 1e-12} (plain halves flushed both to 0),
  // {1e6, 2}, {0, -0}.
  const std::vector<float> x = {1.0f, -0.5f, 3e-9f, 1e-12f, 1e6f, 2.0f, 0.0f, -0.0f};
  const std::vector<uint8_t> bytes = EncodeVec(o, x, 0);
  ASSERT_EQ(bytes.size(), 4u * 2 + 16);
  // 1.0: ilogb 0, so e = 14 and the half is 2^14 (0x7400).
  EXPECT_EQ(BlockExponent(bytes, o, 0), 14);
  EXPECT_EQ(bytes[2] | (bytes[3] << 8), 0x7400);
  EXPECT_EQ(BlockExponent(bytes, o, 1), 14 - std::ilogb(3e-9f));
  EXPECT_EQ(BlockExponent(bytes, o, 2), 14 - std::ilogb(1e6f));
  EXPECT_EQ(BlockExponent(bytes, o, 3), 0);
  std::vector<float> y;
  ASSERT_TRUE(DecodeVec(o, bytes, x.size(), 0, &y).ok());
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -0.5f);
  EXPECT_NEAR(y[2], 3e-9f, 3e-9f * 0x1p-11f);
  EXPECT_NEAR(y[3], 1e-12f, 1e-12f * 0x1p-10f);  // 2^-11.6 of its block's largest
  EXPECT_NEAR(y[4], 1e6f, 1e6f * 0x1p-11f);
  EXPECT_EQ(y[5], 2.0f);  // 2 * 2^-5 is a half exactly
  EXPECT_EQ(y[6], 0.0f);
  EXPECT_TRUE(std::signbit(y[7]));
}

TEST(Fp16Codec, ExponentsStayInRangeAtFloatsEnds) {
  const CodecOptions o = Options(Codec::kFp16);
  // The largest floats saturate (e = -112); the smallest, subnormal
  // included, keep e = 100 and decode to normal floats or 0.
  const std::vector<float> huge = {FLT_MAX, -3e38f, 1.0f};
  std::vector<float> y;
  std::vector<uint8_t> bytes = EncodeVec(o, huge, 0);
  EXPECT_EQ(BlockExponent(bytes, o, 0), -112);
  ASSERT_TRUE(DecodeVec(o, bytes, huge.size(), 0, &y).ok());
  EXPECT_EQ(y[0], std::ldexp(65504.0f, 112));
  EXPECT_NEAR(y[1], -3e38f, 3e38f * 0x1p-11f);
  EXPECT_EQ(y[2], 0.0f);  // 2^-112 is below half's range
  const std::vector<float> tiny = {1e-30f, 1e-40f, -FLT_MIN};
  bytes = EncodeVec(o, tiny, 0);
  EXPECT_EQ(BlockExponent(bytes, o, 0), 100);
  ASSERT_TRUE(DecodeVec(o, bytes, tiny.size(), 0, &y).ok());
  EXPECT_NEAR(y[0], 1e-30f, 1e-30f * 0x1p-11f);
  for (float v : y) EXPECT_TRUE(v == 0.0f || std::fabs(v) >= FLT_MIN) << v;
}

TEST(Fp16Codec, KeepsInfinityAndRejectsNonFinite) {
  const CodecOptions o = Options(Codec::kFp16);
  std::vector<float> y;
  for (float bad : {INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN()}) {
    const std::vector<float> with_bad = {1.0f, bad, 2.0f};
    const std::vector<uint8_t> bytes = EncodeVec(o, with_bad, 0);
    EXPECT_EQ(BlockExponent(bytes, o, 0), 0);
    const Status status = DecodeVec(o, bytes, 3, 0, &y);
    EXPECT_EQ(status.code(), StatusCode::kCorruption) << bad;
    EXPECT_TRUE(Contains(status.message(), "value[1]")) << status.message();
  }
  // NaN is written as the canonical 0x7E00 whatever its payload.
  const std::vector<float> nan = {std::bit_cast<float>(0xFFC01234u)};
  const std::vector<uint8_t> bytes = EncodeVec(o, nan, 0);
  EXPECT_EQ(bytes[2] | (bytes[3] << 8), 0x7E00);
}

TEST(Bf16Codec, RoundsToNearestEvenAndSaturates) {
  const CodecOptions o = Options(Codec::kBf16);
  const float tie_down = 1.0f + std::ldexp(1.0f, -8);                  // halfway, even below
  const float tie_up = 1.0f + std::ldexp(3.0f, -8);                    // halfway, even above
  const float above = 1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20);
  const std::vector<float> x = {tie_down, tie_up, above, FLT_MAX, -FLT_MAX, 3.0e38f};
  std::vector<float> y;
  ASSERT_TRUE(DecodeVec(o, EncodeVec(o, x, 0), x.size(), 0, &y).ok());
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(y[2], 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(std::bit_cast<uint32_t>(y[3]), 0x7F7F0000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(y[4]), 0xFF7F0000u);
  EXPECT_TRUE(std::isfinite(y[5]));
  const std::vector<float> inf = {INFINITY};
  EXPECT_EQ(DecodeVec(o, EncodeVec(o, inf, 0), 1, 0, &y).code(), StatusCode::kCorruption);
}

TEST(Int8Codec, ZeroTinyAndNonFiniteBlocks) {
  CodecOptions o = Options(Codec::kInt8);
  o.block = 4;
  // Block 0 zeros, block 1 tiny (127/max overflows float: the wide path),
  // block 2 ordinary, block 3 partial.
  const std::vector<float> x = {0.0f, -0.0f, 0.0f, 0.0f,  1e-38f, -5e-39f, 2e-39f, 0.0f,
                                1.0f, -0.5f, 0.25f, 0.0f, 3.0f,   -3.0f};
  const std::vector<uint8_t> bytes = EncodeVec(o, x, 0);
  EXPECT_EQ(LoadF32(bytes.data()), 0.0f);
  std::vector<float> y;
  ASSERT_TRUE(DecodeVec(o, bytes, x.size(), 0, &y).ok());
  for (size_t i = 0; i < x.size(); ++i) {
    const float scale = LoadF32(bytes.data() + (i / 4) * 8);
    // A subnormal scale (block 1) carries less precision: up to 127 codes
    // times its rounding (at most half an ulp, 2^-150) more.
    EXPECT_LE(std::fabs(y[i] - x[i]), 0.5f * scale * 1.0001f + 127 * 0x1p-149f) << i;
  }
  EXPECT_EQ(y[8], 1.0f);
  EXPECT_EQ(static_cast<int8_t>(bytes[2 * 8 + 4]), 127);  // block 2's max maps to 127
  EXPECT_EQ(static_cast<int8_t>(bytes[3 * 8 + 4 + 1]), -127);
  EXPECT_EQ(static_cast<int8_t>(bytes[1 * 8 + 4]), 127);  // also in the wide path
  // A NaN in block 1: its scale is the canonical NaN and Decode refuses it.
  std::vector<float> with_nan = x;
  with_nan[5] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<uint8_t> nan_bytes = EncodeVec(o, with_nan, 0);
  EXPECT_EQ(LoadU32(nan_bytes.data() + 8), 0x7FC00000u);
  const Status status = DecodeVec(o, nan_bytes, x.size(), 0, &y);
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  EXPECT_TRUE(Contains(status.message(), "block 1 scale")) << status.message();
}

TEST(OnebitCodec, SignsScaleAndNonFiniteInput) {
  const CodecOptions o = Options(Codec::kOnebit);
  const std::vector<float> x = {1.0f, -2.0f, 0.0f, -0.0f, 3.0f, -1.0f, 2.0f, -4.0f, 5.0f};
  const std::vector<uint8_t> bytes = EncodeVec(o, x, 0);
  EXPECT_EQ(LoadF32(bytes.data()), 2.0f);  // mean |x| = 18 / 9
  EXPECT_EQ(bytes[4], 0b01011101);         // 1 = x >= 0 (-0.0 too), LSB first
  EXPECT_EQ(bytes[5], 0b1);                // padding bits zero
  std::vector<float> y;
  ASSERT_TRUE(DecodeVec(o, bytes, x.size(), 0, &y).ok());
  EXPECT_EQ(y, (std::vector<float>{2, -2, 2, 2, 2, -2, 2, -2, 2}));
  const std::vector<float> inf = {1.0f, INFINITY};
  const Status status = DecodeVec(o, EncodeVec(o, inf, 0), 2, 0, &y);
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  EXPECT_TRUE(Contains(status.message(), "scale")) << status.message();
}

TEST(TopkCodec, ExactlyTheKLargestWithTiesToLowerIndex) {
  struct Case {
    const char* name;
    std::vector<float> x;
  };
  std::vector<Case> cases;
  for (size_t n : kSizes) cases.push_back({"gaussian", Gaussian(n, n)});
  // Sampled from 1024 values on (a threshold from a quarter of them, at most
  // 4096), ranked whole below: both sides of the line and of 4 x 4096.
  for (size_t n : {size_t{1000}, size_t{1024}, size_t{4099}, size_t{16384}, size_t{20000},
                   size_t{100003}}) {
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::uniform_int_distribution<int> level(-3, 3);
    std::vector<float> ties(n);
    for (float& v : ties) v = static_cast<float>(level(rng));  // heavy ties, +-v equal
    cases.push_back({"ties", ties});
    cases.push_back({"zeros", std::vector<float>(n, 0.0f)});
    std::vector<float> ramp(n);
    for (size_t i = 0; i < n; ++i) ramp[i] = static_cast<float>(i % 97) * (i % 2 ? -1.f : 1.f);
    cases.push_back({"ramp", ramp});
    std::vector<float> spikes = Gaussian(n, n + 1, 1e-3f);
    for (size_t i = 0; i < n; i += 53) spikes[i] = 100.0f;  // a tie block at the top
    cases.push_back({"spikes", spikes});
  }
  for (const Case& c : cases) {
    for (double ratio : {0.001, 0.01, 0.1, 0.5, 0.999, 1.0}) {
      CodecOptions o = Options(Codec::kTopk);
      o.ratio = ratio;
      const size_t n = c.x.size();
      const std::vector<uint8_t> bytes = EncodeVec(o, c.x, 0);
      const std::vector<uint32_t> got = TopkIndicesOf(bytes);
      ASSERT_EQ(got, ReferenceTopk(c.x, KeptCount(o, n)))
          << c.name << " n " << n << " ratio " << ratio;
      for (size_t j = 0; j < got.size(); ++j) {
        ASSERT_EQ(LoadU32(bytes.data() + 4 + 4 * got.size() + 4 * j),
                  std::bit_cast<uint32_t>(c.x[got[j]]));
      }
    }
  }
}

TEST(TopkCodec, NanRanksFirstAndIsRefused) {
  CodecOptions o = Options(Codec::kTopk);
  o.ratio = 0.2;  // k = 2 of 10
  std::vector<float> x = Gaussian(10, 5);
  x[7] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<uint8_t> bytes = EncodeVec(o, x, 0);
  const std::vector<uint32_t> got = TopkIndicesOf(bytes);
  EXPECT_TRUE(std::find(got.begin(), got.end(), 7u) != got.end());
  std::vector<float> y;
  EXPECT_EQ(DecodeVec(o, bytes, 10, 0, &y).code(), StatusCode::kCorruption);
}

TEST(RandomkCodec, IndicesDependOnSeedAndNOnly) {
  const size_t n = 1000;
  const uint32_t k = 37;
  std::vector<uint32_t> a(k), b(k), c(k);
  cpu::RandomkIndices(11, n, k, a.data());
  cpu::RandomkIndices(11, n, k, b.data());
  cpu::RandomkIndices(12, n, k, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_TRUE(std::adjacent_find(a.begin(), a.end()) == a.end());
  EXPECT_LT(a.back(), n);
  std::vector<uint32_t> all(n);
  cpu::RandomkIndices(3, n, static_cast<uint32_t>(n), all.data());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(all[i], i);
  // Encoding different values with the same seed sends the same indices.
  CodecOptions o = Options(Codec::kRandomk);
  o.ratio = 0.037;
  const std::vector<float> x = Gaussian(n, 1), z = Gaussian(n, 2);
  std::vector<uint8_t> ex = EncodeVec(o, x, 11), ez = EncodeVec(o, z, 11);
  for (uint32_t j = 0; j < k; ++j) {
    EXPECT_EQ(LoadF32(ex.data() + 4 * j), x[a[j]]);
    EXPECT_EQ(LoadF32(ez.data() + 4 * j), z[a[j]]);
  }
}

// Mean of Decode(Encode(x, seed)) over `seeds` seeds, and the largest
// |mean - x| in units of each element's standard error.
double WorstZScore(const CodecOptions& o, const std::vector<float>& x, int seeds,
                   const std::vector<double>& stddev) {
  std::vector<double> sum(x.size(), 0.0);
  std::vector<float> y;
  for (int s = 0; s < seeds; ++s) {
    const uint64_t seed = Mix64(static_cast<uint64_t>(s) + 1000);
    const Status status = DecodeVec(o, EncodeVec(o, x, seed), x.size(), seed, &y);
    EXPECT_TRUE(status.ok()) << status.ToString();
    for (size_t i = 0; i < x.size(); ++i) sum[i] += y[i];
  }
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double error = std::fabs(sum[i] / seeds - x[i]);
    worst = std::max(worst, error / (stddev[i] / std::sqrt(seeds) + 1e-9));
  }
  return worst;
}

TEST(RandomkCodec, UnbiasedOverSeeds) {
  // Each value is kept with probability k/n and scaled by n/k: its estimate
  // has mean x and standard deviation |x| sqrt(n/k - 1). Over 20000 seeds
  // the mean must sit within 5 standard errors for all 100 values.
  CodecOptions o = Options(Codec::kRandomk);
  o.ratio = 0.1;
  const std::vector<float> x = Gaussian(100, 9);
  std::vector<double> stddev(x.size());
  for (size_t i = 0; i < x.size(); ++i) stddev[i] = std::fabs(x[i]) * std::sqrt(100.0 / 10 - 1);
  EXPECT_LT(WorstZScore(o, x, 20000, stddev), 5.0);
  // Inclusion frequency per index ~ k/n (binomial, 5 sigma).
  std::vector<int> hits(100, 0);
  std::vector<uint32_t> idx(10);
  for (int s = 0; s < 20000; ++s) {
    cpu::RandomkIndices(Mix64(s), 100, 10, idx.data());
    for (uint32_t i : idx) ++hits[i];
  }
  const double mean = 2000.0, sigma = std::sqrt(20000 * 0.1 * 0.9);
  for (int i = 0; i < 100; ++i) EXPECT_NEAR(hits[i], mean, 5 * sigma) << i;
}

TEST(QsgdCodec, UnbiasedOverSeeds) {
  // Level rounding adds at most (norm/s)^2/4 variance per value.
  for (int bits : {1, 2, 4}) {
    CodecOptions o = Options(Codec::kQsgd);
    o.bits = bits;
    const std::vector<float> x = Gaussian(64, 17 + bits);
    double norm = 0;
    for (float v : x) norm += double{v} * v;
    norm = std::sqrt(norm);
    const double s = (1 << bits) - 1;
    std::vector<double> stddev(x.size(), norm / s / 2);
    EXPECT_LT(WorstZScore(o, x, 20000, stddev), 5.0) << "bits " << bits;
  }
}

TEST(QsgdCodec, EveryBitWidthAndSeedDependence) {
  const std::vector<float> x = Gaussian(1001, 4);
  for (int bits = 1; bits <= 8; ++bits) {
    CodecOptions o = Options(Codec::kQsgd);
    o.bits = bits;
    const std::vector<uint8_t> a = EncodeVec(o, x, 1);
    EXPECT_NE(a, EncodeVec(o, x, 2)) << bits;
    std::vector<float> y;
    ASSERT_TRUE(DecodeVec(o, a, x.size(), 1, &y).ok()) << bits;
    const float step = LoadF32(a.data()) / static_cast<float>((1 << bits) - 1);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_LE(std::fabs(y[i] - x[i]), step * 1.0001f) << "bits " << bits << " i " << i;
  }
  // All-zero input: norm 0, every code 0.
  const CodecOptions o = Options(Codec::kQsgd);
  const std::vector<uint8_t> zero = EncodeVec(o, std::vector<float>(9, 0.0f), 1);
  EXPECT_TRUE(std::all_of(zero.begin(), zero.end(), [](uint8_t b) { return b == 0; }));
}

}  // namespace
}  // namespace gridsync
