// Malformed codec payloads (kernels/cpu/codec.h's decode side): every class
// of bad payload (wrong size, non-finite or negative scales, non-finite
// values, bad top-k indices and k, bad QSGD codes and padding, onebit
// padding, int8 codes, bad arguments) is refused with a Status naming it,
// and random buffers never crash the decoder.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/codec.h"
#include "tests/codec_test_util.h"

namespace gridsync {
namespace {

using codec_testing::Contains;
using codec_testing::DecodeVec;
using codec_testing::EncodeVec;
using codec_testing::Gaussian;
using codec_testing::LoadU32;
using codec_testing::Options;
using codec_testing::StoreF32;
using codec_testing::StoreU32;

// ---------------------------------------------------------------------------
// Malformed payloads: every class is refused with a Status naming it.

void ExpectRefused(const CodecOptions& o, const std::vector<uint8_t>& bytes, size_t n,
                   const std::string& part, StatusCode code = StatusCode::kCorruption,
                   uint64_t seed = 0) {
  std::vector<float> y;
  const Status status = DecodeVec(o, bytes, n, seed, &y);
  ASSERT_FALSE(status.ok()) << CodecName(o.codec) << ": expected a refusal naming '" << part << "'";
  EXPECT_EQ(status.code(), code) << status.ToString();
  EXPECT_TRUE(Contains(status.message(), part)) << status.message();
  EXPECT_TRUE(Contains(status.message(), std::string(CodecName(o.codec)))) << status.message();
}

TEST(CodecMalformed, WrongSizeNamesBothSizes) {
  for (Codec codec : kAllCodecs) {
    const CodecOptions o = Options(codec);
    const size_t n = 1000;
    const std::vector<uint8_t> good = EncodeVec(o, Gaussian(n, 1), 0);
    std::vector<uint8_t> longer = good;
    longer.push_back(0);
    ExpectRefused(o, longer, n,
                  "payload has " + std::to_string(good.size() + 1) + " bytes; expected " +
                      std::to_string(good.size()));
    std::vector<uint8_t> shorter(good.begin(), good.end() - 1);
    ExpectRefused(o, shorter, n, "payload has " + std::to_string(good.size() - 1) + " bytes");
    ExpectRefused(o, {}, n, "payload has 0 bytes");
  }
}

TEST(CodecMalformed, NonFiniteOrNegativeScales) {
  const float bad_scales[] = {std::numeric_limits<float>::quiet_NaN(), INFINITY, -1.0f, FLT_MAX};
  for (Codec codec : {Codec::kInt8, Codec::kOnebit, Codec::kQsgd}) {
    const CodecOptions o = Options(codec);
    const size_t n = 300;
    const std::vector<uint8_t> good = EncodeVec(o, Gaussian(n, 2), 0);
    for (float scale : bad_scales) {
      // Only int8 multiplies its scale by up to 127: FLT_MAX overflows there;
      // onebit's +-FLT_MAX and qsgd's level * (FLT_MAX / s) decode fine.
      if (codec != Codec::kInt8 && scale == FLT_MAX) continue;
      std::vector<uint8_t> bytes = good;
      // int8: the second block's scale; onebit and qsgd: the header.
      const size_t at = codec == Codec::kInt8 ? 260 : 0;
      StoreF32(bytes.data() + at, scale);
      ExpectRefused(
          o, bytes, n,
          codec == Codec::kInt8 ? "block 1 scale" : (codec == Codec::kQsgd ? "norm" : "scale"));
    }
  }
}

TEST(CodecMalformed, NonFiniteValues) {
  const size_t n = 100;
  const std::vector<float> x = Gaussian(n, 3);
  {
    const CodecOptions o = Options(Codec::kNone);
    for (float bad : {INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN()}) {
      std::vector<uint8_t> bytes = EncodeVec(o, x, 0);
      StoreF32(bytes.data() + 4 * 42, bad);
      ExpectRefused(o, bytes, n, "value[42]");
    }
  }
  for (uint16_t bad : {uint16_t{0x7C00}, uint16_t{0xFC00}, uint16_t{0x7E01}}) {
    CodecOptions o = Options(Codec::kFp16);
    o.block = 16;  // value 42 is block 2's value 10
    std::vector<uint8_t> bytes = EncodeVec(o, x, 0);
    std::memcpy(bytes.data() + 2 * 34 + 2 + 2 * 10, &bad, 2);
    ExpectRefused(o, bytes, n, "value[42]");
  }
  for (uint16_t bad : {uint16_t{0x7F80}, uint16_t{0xFF80}, uint16_t{0x7FC0}}) {
    const CodecOptions o = Options(Codec::kBf16);
    std::vector<uint8_t> bytes = EncodeVec(o, x, 0);
    std::memcpy(bytes.data() + 2 * 42, &bad, 2);
    ExpectRefused(o, bytes, n, "value[42]");
  }
  {
    CodecOptions o = Options(Codec::kTopk);
    o.ratio = 0.1;  // k = 10
    std::vector<uint8_t> bytes = EncodeVec(o, x, 0);
    StoreF32(bytes.data() + 4 + 40 + 4 * 3, INFINITY);
    ExpectRefused(o, bytes, n, "value[3]");
  }
  {
    CodecOptions o = Options(Codec::kRandomk);
    o.ratio = 0.1;
    std::vector<uint8_t> bytes = EncodeVec(o, x, 5);
    StoreF32(bytes.data() + 4 * 3, std::numeric_limits<float>::quiet_NaN());
    ExpectRefused(o, bytes, n, "value[3]", StatusCode::kCorruption, 5);
    bytes = EncodeVec(o, x, 5);
    StoreF32(bytes.data() + 4 * 3, 3e38f);  // finite, but x10 overflows
    ExpectRefused(o, bytes, n, "overflows", StatusCode::kCorruption, 5);
  }
}

TEST(CodecMalformed, TopkIndicesAndK) {
  CodecOptions o = Options(Codec::kTopk);
  o.ratio = 0.1;
  const size_t n = 100;  // k = 10
  const std::vector<uint8_t> good = EncodeVec(o, Gaussian(n, 4), 0);
  auto with_index = [&](uint32_t j, uint32_t index) {
    std::vector<uint8_t> bytes = good;
    StoreU32(bytes.data() + 4 + 4 * j, index);
    return bytes;
  };
  ExpectRefused(o, with_index(9, 100), n, "index[9] = 100 is out of range; allowed: < n = 100");
  ExpectRefused(o, with_index(9, 0xFFFFFFFFu), n, "out of range");
  const uint32_t third = LoadU32(good.data() + 4 + 4 * 2);
  ExpectRefused(o, with_index(3, third), n, "strictly ascending");      // duplicate
  ExpectRefused(o, with_index(3, third - 1), n, "strictly ascending");  // backwards
  std::vector<uint8_t> bytes = good;
  StoreU32(bytes.data(), 11);
  ExpectRefused(o, bytes, n, "k is 11; expected 10");
  StoreU32(bytes.data(), 0);
  ExpectRefused(o, bytes, n, "k is 0; expected 10");
}

TEST(CodecMalformed, QsgdCodesAndPadding) {
  // Levels are `bits` wide, so no level can exceed s = 2^bits - 1; what can
  // be wrong is a negative zero (the encoder never writes one), padding bits
  // after the last code, and the norm (tested above).
  const CodecOptions o = Options(Codec::kQsgd);  // 5-bit codes
  const size_t n = 7;                            // 35 bits: 5 padding bits
  std::vector<float> x = Gaussian(n, 6);
  x[0] = 0.0f;  // code 0 exactly
  const std::vector<uint8_t> good = EncodeVec(o, x, 0);
  EXPECT_EQ(good[4] & 0x1F, 0);
  std::vector<uint8_t> bytes = good;
  bytes[4] |= 0x10;  // sign bit of code 0, level 0
  ExpectRefused(o, bytes, n, "code[0] is a negative level 0");
  bytes = good;
  bytes.back() |= 0x80;
  ExpectRefused(o, bytes, n, "padding bits");
}

TEST(CodecMalformed, OnebitPaddingAndInt8Code) {
  {
    const CodecOptions o = Options(Codec::kOnebit);
    std::vector<uint8_t> bytes = EncodeVec(o, Gaussian(7, 7), 0);
    bytes.back() |= 0x80;
    ExpectRefused(o, bytes, 7, "padding bits");
  }
  {
    const CodecOptions o = Options(Codec::kInt8);
    std::vector<uint8_t> bytes = EncodeVec(o, Gaussian(300, 8), 0);
    bytes[260 + 4 + 5] = 0x80;  // value 261
    ExpectRefused(o, bytes, 300, "value[261] has code -128; allowed: -127..127");
  }
  // fp16's exponents: in [-112, 100], which keeps every decoded value a
  // normal, finite float.
  for (int16_t e : {int16_t{-113}, int16_t{101}, int16_t{-32768}, int16_t{32767}}) {
    const CodecOptions o = Options(Codec::kFp16);
    std::vector<uint8_t> bytes = EncodeVec(o, Gaussian(300, 8), 0);
    std::memcpy(bytes.data() + 514, &e, 2);  // block 1
    ExpectRefused(o, bytes, 300, "block 1 exponent " + std::to_string(e) + "; allowed: -112..100");
  }
}

TEST(CodecMalformed, BadArguments) {
  const CodecOptions o = Options(Codec::kFp16);
  std::vector<uint8_t> bytes(EncodedSize(o, 10));
  float out[10];
  EXPECT_EQ(cpu::Decode(o, bytes.data(), bytes.size(), 10, 0, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu::Decode(o, nullptr, bytes.size(), 10, 0, out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu::Decode(o, bytes.data(), bytes.size(), kMaxCodecValues + 1, 0, out).code(),
            StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Fuzz: random bytes never crash Decode, and an accepted payload decodes to
// finite values only.

TEST(CodecFuzz, RandomBuffersNeverCrash) {
  std::mt19937_64 rng(2024);
  size_t accepted = 0, refused = 0;
  for (Codec codec : kAllCodecs) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{64}, size_t{300}}) {
      CodecOptions o = Options(codec);
      o.ratio = 0.25;
      o.block = 16;
      o.bits = static_cast<int>(1 + rng() % 8);
      const size_t size = EncodedSize(o, n);
      std::vector<uint8_t> bytes(size);
      std::vector<float> y(n);
      for (int trial = 0; trial < 100; ++trial) {
        // Mostly uniform bytes; every fourth buffer is mostly zeros, which
        // gets past the headers more often.
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(trial % 4 == 0 && rng() % 8 ? 0 : rng());
        if (codec == Codec::kTopk && trial % 2 == 0 && size >= 4)
          StoreU32(bytes.data(), KeptCount(o, n));  // a valid k, to reach the indices
        const Status status = cpu::Decode(o, bytes.data(), size, n, trial, y.data());
        if (status.ok()) {
          ++accepted;
          for (size_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(y[i])) << codec << " " << i;
        } else {
          ++refused;
          EXPECT_NE(status.code(), StatusCode::kInternal) << status.ToString();
        }
        // The wrong size is always refused.
        bytes.push_back(0);
        EXPECT_FALSE(cpu::Decode(o, bytes.data(), bytes.size(), n, trial, y.data()).ok());
        bytes.pop_back();
      }
    }
  }
  EXPECT_EQ(accepted + refused, std::size(kAllCodecs) * 4 * 100);
  EXPECT_GT(accepted, 0u);
  EXPECT_GT(refused, 0u);
}

}  // namespace
}  // namespace gridsync
