// The CUDA codecs (kernels/cuda/codec_kernels.h) against the CPU reference
// (kernels/cpu/codec.h): for every codec, size and option set the device
// writes the very bytes the CPU writes (topk: the same selected indices,
// compared on their own first for a clear message), decodes to the same
// floats bit for bit, and refuses malformed payloads with the CPU's Status.
//
// Every GPU test skips, printing why, where cuda::Available() is false (no
// nvcc at configure time, or no device), so the suite passes on CPU-only CI.
// One test runs everywhere: without a device the host API answers with a
// non-OK Status instead of crashing.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/codec.h"
#include "kernels/cuda/block_codec.h"
#include "kernels/cuda/codec_kernels.h"

namespace gridsync {
namespace {

constexpr size_t kSizes[] = {1, 7, 256, 1000, 100003};

enum class Data { kGaussian, kTies, kSpecial };

std::vector<float> MakeData(Data data, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    switch (data) {
      case Data::kGaussian: x[i] = gauss(rng); break;
      case Data::kTies: x[i] = static_cast<float>(static_cast<int>(rng() % 7) - 3); break;
      case Data::kSpecial: {
        // Subnormals, signed zeros, huge values and (rarely) non-finite
        // ones: the paths where roundings and NaN handling could diverge.
        const float specials[] = {0.0f,   -0.0f,  1e-40f, -3e-39f, 7e4f, -1e6f,
                                  3e38f,  65504.f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f};
        x[i] = rng() % 3 == 0 ? specials[rng() % std::size(specials)] : gauss(rng);
        break;
      }
    }
  }
  if (data == Data::kSpecial && n >= 256) {
    x[n / 2] = std::numeric_limits<float>::quiet_NaN();
    x[n / 3] = -std::numeric_limits<float>::infinity();
  }
  return x;
}

const char* DataName(Data data) {
  switch (data) {
    case Data::kGaussian: return "gaussian";
    case Data::kTies: return "ties";
    case Data::kSpecial: return "special";
  }
  return "?";
}

std::vector<CodecOptions> OptionSets(Codec codec) {
  std::vector<CodecOptions> out;
  CodecOptions o;
  o.codec = codec;
  switch (codec) {
    case Codec::kQsgd:
      for (int bits : {1, 4, 7, 8}) {
        o.bits = bits;
        out.push_back(o);
      }
      break;
    case Codec::kInt8:
      for (uint32_t block : {1u, 33u, 256u, 4096u}) {
        o.block = block;
        out.push_back(o);
      }
      break;
    case Codec::kTopk:
    case Codec::kRandomk:
      for (double ratio : {0.01, 0.3, 1.0}) {
        o.ratio = ratio;
        out.push_back(o);
      }
      break;
    default:
      out.push_back(o);
  }
  return out;
}

std::string Describe(const CodecOptions& o, size_t n, Data data) {
  return std::string(CodecName(o.codec)) + " n " + std::to_string(n) + " bits " +
         std::to_string(o.bits) + " block " + std::to_string(o.block) + " ratio " +
         std::to_string(o.ratio) + " data " + DataName(data);
}

std::vector<uint8_t> CpuEncode(const CodecOptions& o, const std::vector<float>& x, uint64_t seed) {
  std::vector<uint8_t> out(EncodedSize(o, x.size()));
  cpu::Encode(o, x.data(), x.size(), seed, out.data());
  return out;
}

// The first mismatching byte, for a readable failure.
std::string FirstDifference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size())
    return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) {
      return "byte " + std::to_string(i) + ": cpu " + std::to_string(a[i]) + " gpu " +
             std::to_string(b[i]);
    }
  }
  return "none";
}

void ExpectSameDecode(const CodecOptions& o, const std::vector<uint8_t>& bytes, size_t n,
                      uint64_t seed, const std::string& what) {
  std::vector<float> want(n);
  const Status cpu_status = cpu::Decode(o, bytes.data(), bytes.size(), n, seed, want.data());
  std::vector<float> got;
  const Status gpu_status = cuda::host::Decode(o, bytes, n, seed, &got);
  ASSERT_EQ(gpu_status.code(), cpu_status.code())
      << what << ": cpu " << cpu_status.ToString() << " / gpu " << gpu_status.ToString();
  EXPECT_EQ(gpu_status.message(), cpu_status.message()) << what;
  if (!cpu_status.ok()) return;
  ASSERT_EQ(got.size(), n) << what;
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i])) continue;
    if (++differ <= 3)
      ADD_FAILURE() << what << ": decoded[" << i << "] cpu " << want[i] << " gpu " << got[i];
  }
  EXPECT_EQ(differ, 0u) << what;
}

class CudaCodecTest : public testing::TestWithParam<std::tuple<Codec, size_t>> {};

TEST_P(CudaCodecTest, BytesAndDecodeMatchCpu) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  const auto [codec, n] = GetParam();
  for (Data data : {Data::kGaussian, Data::kTies, Data::kSpecial}) {
    const std::vector<float> x = MakeData(data, n, 100 * n + static_cast<int>(data));
    for (const CodecOptions& o : OptionSets(codec)) {
      const std::string what = Describe(o, n, data);
      const uint64_t seed = 0xC0DEC + n;
      const std::vector<uint8_t> want = CpuEncode(o, x, seed);
      std::vector<uint8_t> got;
      const Status status = cuda::host::Encode(o, x, seed, &got);
      ASSERT_TRUE(status.ok()) << what << ": " << status.ToString();
      ASSERT_EQ(got.size(), want.size()) << what;
      if (codec == Codec::kTopk) {
        // The selected set first: k and the ascending indices.
        const size_t k = KeptCount(o, n);
        ASSERT_TRUE(std::equal(want.begin(), want.begin() + 4 + 4 * k, got.begin()))
            << what << ": selected indices differ (" << FirstDifference(want, got) << ")";
      }
      ASSERT_EQ(got, want) << what << ": first difference " << FirstDifference(want, got);
      ExpectSameDecode(o, want, n, seed, what);
    }
  }
}

std::string ParamName(const testing::TestParamInfo<CudaCodecTest::ParamType>& param) {
  return std::string(CodecName(std::get<0>(param.param))) + "_n" +
         std::to_string(std::get<1>(param.param));
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CudaCodecTest,
                         testing::Combine(testing::ValuesIn(kAllCodecs), testing::ValuesIn(kSizes)),
                         ParamName);

TEST(CudaCodec, EmptyArrays) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  for (Codec codec : kAllCodecs) {
    CodecOptions o;
    o.codec = codec;
    std::vector<uint8_t> got;
    ASSERT_TRUE(cuda::host::Encode(o, {}, 1, &got).ok()) << codec;
    EXPECT_EQ(got, CpuEncode(o, {}, 1)) << codec;
    ExpectSameDecode(o, got, 0, 1, std::string(CodecName(codec)) + " n 0");
  }
}

TEST(CudaCodec, MalformedPayloadsGetTheCpuStatus) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  const size_t n = 300;
  const std::vector<float> x = MakeData(Data::kGaussian, n, 5);
  std::mt19937_64 rng(9);
  size_t refused = 0;
  for (Codec codec : kAllCodecs) {
    CodecOptions o;
    o.codec = codec;
    o.ratio = 0.1;
    const std::vector<uint8_t> good = CpuEncode(o, x, 3);
    // Targeted corruptions: every header/index/value class, plus random
    // byte flips; the statuses must agree either way.
    std::vector<std::vector<uint8_t>> payloads;
    auto corrupt = [&](size_t at, std::initializer_list<uint8_t> bytes) {
      std::vector<uint8_t> p = good;
      size_t i = at;
      for (uint8_t b : bytes)
        if (i < p.size()) p[i++] = b;
      payloads.push_back(p);
    };
    corrupt(0, {0x00, 0x00, 0xC0, 0x7F});  // NaN header / first value
    corrupt(0, {0x00, 0x00, 0x80, 0xFF});  // -inf
    corrupt(4, {0xFF, 0xFF, 0xFF, 0xFF});  // index out of range / NaN value
    corrupt(8, {0x00, 0x00, 0x00, 0x00});  // topk: not ascending
    corrupt(good.size() - 1, {0xFF});      // padding bits, int8 -1 / NaN halves
    corrupt(6, {0x80});                    // int8 code -128
    for (int t = 0; t < 20; ++t) {
      std::vector<uint8_t> p = good;
      p[rng() % p.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      payloads.push_back(p);
    }
    std::vector<uint8_t> longer = good;
    longer.push_back(0);
    payloads.push_back(longer);
    for (size_t i = 0; i < payloads.size(); ++i) {
      const std::string what = std::string(CodecName(codec)) + " payload " + std::to_string(i);
      ExpectSameDecode(o, payloads[i], n, 3, what);
      std::vector<float> y(n);
      refused += !cpu::Decode(o, payloads[i].data(), payloads[i].size(), n, 3, y.data()).ok();
    }
  }
  EXPECT_GT(refused, std::size(kAllCodecs));  // at least the wrong sizes, and more
}

TEST(CudaCodec, DeviceApiRejectsBadArguments) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  CodecOptions o;
  o.codec = Codec::kQsgd;
  o.bits = 0;
  std::vector<uint8_t> bytes;
  Status status = cuda::host::Encode(o, {1.0f}, 0, &bytes);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  o.bits = 4;
  EXPECT_EQ(cuda::host::Encode(o, {1.0f}, 0, nullptr).code(), StatusCode::kInvalidArgument);
  std::vector<float> out;
  status = cuda::host::Decode(o, std::vector<uint8_t>(3), 10, 0, &out);
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_NE(status.message().find("payload has 3 bytes"), std::string::npos) << status.message();
  EXPECT_EQ(cuda::Encode(o, nullptr, 10, 0, nullptr, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::Decode(o, nullptr, EncodedSize(o, 10), 10, 0, nullptr, nullptr).code(),
            StatusCode::kInvalidArgument);
}

// Runs everywhere: without a device (or without CUDA) the host API returns
// a Status, never crashes; with one, the same calls succeed.
TEST(CudaCodec, HostApiWithoutDeviceFailsCleanly) {
  std::string reason;
  const bool available = cuda::Available(&reason);
  CodecOptions o;
  o.codec = Codec::kOnebit;
  const std::vector<float> x = {1.0f, -2.0f, 3.0f};
  std::vector<uint8_t> bytes;
  const Status encoded = cuda::host::Encode(o, x, 0, &bytes);
  std::vector<float> out;
  const Status decoded = cuda::host::Decode(o, CpuEncode(o, x, 0), x.size(), 0, &out);
  if (available) {
    EXPECT_TRUE(encoded.ok()) << encoded.ToString();
    EXPECT_TRUE(decoded.ok()) << decoded.ToString();
    EXPECT_EQ(bytes, CpuEncode(o, x, 0));
    return;
  }
  ASSERT_FALSE(reason.empty());
  EXPECT_FALSE(encoded.ok()) << "no device (" << reason << ") but Encode succeeded";
  EXPECT_FALSE(decoded.ok()) << "no device (" << reason << ") but Decode succeeded";
  EXPECT_NE(encoded.code(), StatusCode::kOk);
  std::cout << "without a device: Encode -> " << encoded.ToString() << "\n";
}

// The PS pushes' device codec (block_codec.h): for every codec, blocks of
// growing and shrinking sizes on one BlockCodec (its buffers reused), the
// CPU's bytes and decoded floats bit for bit; a NaN block gets the CPU's
// refusal. Without a device, Create says why.
TEST(CudaCodec, TheBlockCodecWritesTheCpuBytesAndDecodes) {
  std::string reason;
  auto codec = cuda::BlockCodec::Create(0);
  if (!cuda::Available(&reason)) {
    ASSERT_FALSE(codec.ok());
    GTEST_SKIP() << reason << " (BlockCodec::Create: " << codec.status().ToString() << ")";
  }
  ASSERT_TRUE(codec.ok()) << codec.status().ToString();
  for (Codec c : kAllCodecs) {
    for (const CodecOptions& o : OptionSets(c)) {
      for (size_t n : {size_t{1000}, size_t{100003}, size_t{7}, size_t{0}}) {
        SCOPED_TRACE(Describe(o, n, Data::kGaussian));
        const auto x = MakeData(Data::kGaussian, n, n + 3);
        std::vector<uint8_t> payload(EncodedSize(o, n));
        std::vector<float> decoded(n);
        const Status status = (*codec)->Encode(o, x.data(), n, 42, payload.data(), decoded.data());
        ASSERT_TRUE(status.ok()) << status.ToString();
        EXPECT_EQ(payload, CpuEncode(o, x, 42));
        std::vector<float> want(n);
        ASSERT_TRUE(cpu::Decode(o, payload.data(), payload.size(), n, 42, want.data()).ok());
        EXPECT_EQ(0, std::memcmp(decoded.data(), want.data(), n * sizeof(float)));
      }
    }
  }
  CodecOptions onebit;
  onebit.codec = Codec::kOnebit;
  std::vector<float> nan(64, std::numeric_limits<float>::quiet_NaN());
  std::vector<uint8_t> payload(EncodedSize(onebit, nan.size()));
  std::vector<float> decoded(nan.size());
  std::vector<uint8_t> cpu_payload(payload.size());
  cpu::Encode(onebit, nan.data(), nan.size(), 1, cpu_payload.data());
  const Status want =
      cpu::Decode(onebit, cpu_payload.data(), cpu_payload.size(), nan.size(), 1, decoded.data());
  const Status got =
      (*codec)->Encode(onebit, nan.data(), nan.size(), 1, payload.data(), decoded.data());
  EXPECT_EQ(got.ok(), want.ok());
  if (!want.ok()) {
    EXPECT_EQ(got.ToString(), want.ToString());
  }
}

}  // namespace
}  // namespace gridsync
