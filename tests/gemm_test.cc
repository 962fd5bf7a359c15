// kernels/cpu/gemm.h: oneDNN's products against Eigen's for every transpose,
// leading dimension and accumulate flag; bf16 as rounded fp32 operands.
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/codec.h"

namespace gridsync::cpu {
namespace {

struct Case {
  int m, n, k;
  bool ta, tb, accumulate;
  int pad;  // extra rows in every leading dimension
};

struct Operands {
  std::vector<float> a, b, c;
  int lda, ldb, ldc;
};

Operands Make(const Case& t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Operands o;
  // Stored shapes: A is m x k (k x m transposed), B is k x n (n x k).
  const int a_rows = t.ta ? t.k : t.m, a_cols = t.ta ? t.m : t.k;
  const int b_rows = t.tb ? t.n : t.k, b_cols = t.tb ? t.k : t.n;
  o.lda = std::max(1, a_rows + t.pad);
  o.ldb = std::max(1, b_rows + t.pad);
  o.ldc = std::max(1, t.m + t.pad);
  o.a.resize(size_t(o.lda) * a_cols + 1);
  o.b.resize(size_t(o.ldb) * b_cols + 1);
  o.c.resize(size_t(o.ldc) * t.n);
  for (float& v : o.a) v = dist(rng);
  for (float& v : o.b) v = dist(rng);
  for (float& v : o.c) v = dist(rng);
  return o;
}

// C as the definition has it, in double.
std::vector<double> Reference(const Case& t, const Operands& o) {
  std::vector<double> c(o.c.begin(), o.c.end());
  for (int j = 0; j < t.n; ++j) {
    for (int i = 0; i < t.m; ++i) {
      double sum = t.accumulate ? c[i + size_t(j) * o.ldc] : 0.0;
      for (int p = 0; p < t.k; ++p) {
        const float a = t.ta ? o.a[p + size_t(i) * o.lda] : o.a[i + size_t(p) * o.lda];
        const float b = t.tb ? o.b[j + size_t(p) * o.ldb] : o.b[p + size_t(j) * o.ldb];
        sum += double{a} * b;
      }
      c[i + size_t(j) * o.ldc] = sum;
    }
  }
  return c;
}

std::vector<float> Product(MatmulFormat format, GemmEngine engine, const Case& t, Operands o) {
  SetGemmEngine(engine);
  Gemm(format, t.m, t.n, t.k, {o.a.data(), o.lda, t.ta}, {o.b.data(), o.ldb, t.tb}, o.c.data(),
       o.ldc, t.accumulate);
  SetGemmEngine(GemmEngine::kAuto);
  return o.c;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  // The MLP's shapes (a 2048-column chunk, a ragged tail, the 3-wide output
  // layer and its weight gradient, which oneDNN computes as its transpose:
  // a few rows of long products) and odd ones, each with every transpose and
  // accumulate flag.
  const int shapes[][3] = {{64, 2048, 64}, {64, 77, 32},  {3, 129, 64}, {64, 64, 300},
                           {32, 64, 2048}, {3, 64, 2048}, {8, 33, 256}, {1, 5, 300},
                           {5, 7, 3},      {1, 1, 1},     {17, 33, 1},  {0, 5, 4},
                           {5, 0, 4},      {5, 6, 0}};
  for (const auto& s : shapes)
    for (int flags = 0; flags < 8; ++flags)
      for (int pad : {0, 3})
        cases.push_back(
            {s[0], s[1], s[2], (flags & 1) != 0, (flags & 2) != 0, (flags & 4) != 0, pad});
  return cases;
}

std::string Describe(const Case& t) {
  return "m " + std::to_string(t.m) + " n " + std::to_string(t.n) + " k " + std::to_string(t.k) +
         (t.ta ? " A^T" : "") + (t.tb ? " B^T" : "") + (t.accumulate ? " C+=" : " C=") + " pad " +
         std::to_string(t.pad);
}

// Every fp32 engine ends within fp32 rounding of the exact product; the
// padding between columns is never written.
TEST(GemmTest, EveryEngineComputesTheDefinitionInFp32) {
  for (GemmEngine engine : {GemmEngine::kEigen, GemmEngine::kOneDnn}) {
    if (engine == GemmEngine::kOneDnn && !OneDnnAvailable()) {
      std::printf("oneDNN: not in this build (libdnnl-dev); Eigen only\n");
      continue;
    }
    for (const Case& t : Cases()) {
      const Operands o = Make(t, 7);
      const std::vector<double> want = Reference(t, o);
      const std::vector<float> got = Product(MatmulFormat::kFp32, engine, t, o);
      for (size_t i = 0; i < got.size(); ++i) {
        const bool in_matrix = int(i % size_t(o.ldc)) < t.m;
        if (!in_matrix) {
          ASSERT_EQ(got[i], o.c[i]) << Describe(t) << ": padding at " << i << " written";
          continue;
        }
        // |sum| <= k, each product's rounding error ~k ulps of 1 at most.
        ASSERT_NEAR(got[i], want[i], 1e-6 * (t.k + 2) * 4)
            << Describe(t) << " engine " << int(engine) << " at " << i;
      }
    }
  }
}

// bf16: the product of the operands rounded to bf16, summed in fp32. Eigen's
// twin is exactly the fp32 product of pre-rounded operands; oneDNN's native
// product agrees with it to fp32 rounding of the sums.
TEST(GemmTest, Bf16IsTheFp32ProductOfRoundedOperands) {
  for (const Case& t : Cases()) {
    Operands o = Make(t, 9);
    Operands rounded = o;
    RoundToBf16(o.a.data(), o.a.size(), rounded.a.data());
    RoundToBf16(o.b.data(), o.b.size(), rounded.b.data());
    const std::vector<float> fp32_of_rounded =
        Product(MatmulFormat::kFp32, GemmEngine::kEigen, t, rounded);
    const std::vector<float> twin = Product(MatmulFormat::kBf16, GemmEngine::kEigen, t, o);
    // An empty shape has null data: memcmp must not see it (UBSan).
    ASSERT_EQ(twin.size(), fp32_of_rounded.size()) << Describe(t);
    ASSERT_TRUE(twin.empty() ||
                std::memcmp(twin.data(), fp32_of_rounded.data(), twin.size() * sizeof(float)) == 0)
        << Describe(t);
    const std::vector<float> exact = Product(MatmulFormat::kFp32, GemmEngine::kEigen, t, o);
    if (t.k >= 32) {
      double diff = 0;
      for (size_t i = 0; i < exact.size(); ++i)
        diff = std::max(diff, double(std::fabs(exact[i] - twin[i])));
      EXPECT_GT(diff, 0.0) << Describe(t) << ": rounding to bf16 changed nothing";
    }
    if (!NativeBf16Available()) continue;
    const std::vector<double> want = Reference(t, rounded);
    const std::vector<float> native = Product(MatmulFormat::kBf16, GemmEngine::kOneDnn, t, o);
    for (size_t i = 0; i < native.size(); ++i)
      ASSERT_NEAR(native[i], want[i], 1e-6 * (t.k + 2) * 4) << Describe(t) << " at " << i;
  }
  if (!NativeBf16Available())
    std::printf("native bf16: not on this CPU or build; the rounded-operand twin was checked\n");
}

// A product in bf16: the sums (or a hidden layer's activations, the ReLU of
// the sums) rounded once. Eigen's twin is exactly Bf16Bits(its fp32 sums),
// or of their ReLU; oneDNN's epilogue, whose sums run in another order,
// follows it to one bf16 step and fp32 rounding.
TEST(GemmTest, Bf16OutIsTheRoundedSumsOrTheirRelu) {
  if (!NativeBf16Available())
    std::printf("native bf16: not on this CPU or build; Eigen's twin only\n");
  size_t negatives[2] = {0, 0};  // by relu
  for (const Case& t : Cases()) {
    for (bool relu : {true, false}) {
      if (t.accumulate) continue;
      Operands o = Make(t, 11);
      std::vector<uint16_t> a16(o.a.size()), b16(o.b.size());
      ToBf16Bits(o.a.data(), o.a.size(), a16.data());
      ToBf16Bits(o.b.data(), o.b.size(), b16.data());
      const Bf16Operand a{a16.data(), o.lda, t.ta}, b{b16.data(), o.ldb, t.tb};
      SetGemmEngine(GemmEngine::kEigen);
      std::vector<float> sums(o.c.size(), 0.0f);
      GemmBf16(t.m, t.n, t.k, a, b, sums.data(), o.ldc, /*accumulate=*/false);
      std::vector<uint16_t> want(o.c.size(), 0xABCD);
      for (size_t i = 0; i < want.size(); ++i) {
        if (int(i % size_t(o.ldc)) < t.m)
          want[i] = Bf16Bits(relu && !(sums[i] > 0.0f) ? 0.0f : sums[i]);
      }
      // Only a product without the ReLU keeps negative sums.
      for (uint16_t w : want)
        negatives[relu] += w != 0xABCD && (w & 0x8000) != 0 && (w & 0x7FFF) != 0;
      for (GemmEngine engine : {GemmEngine::kEigen, GemmEngine::kOneDnn}) {
        if (engine == GemmEngine::kOneDnn && !NativeBf16Available()) continue;
        std::vector<uint16_t> c(o.c.size(), 0xABCD);
        SetGemmEngine(engine);
        GemmBf16Out(t.m, t.n, t.k, a, b, c.data(), o.ldc, relu);
        for (size_t i = 0; i < c.size(); ++i) {
          if (engine == GemmEngine::kEigen || want[i] == 0xABCD) {
            ASSERT_EQ(c[i], want[i]) << Describe(t) << " engine " << int(engine) << " at " << i;
          } else {
            // One bf16 step of rounding, plus what another order of the fp32
            // sums moves them (a sum that cancels to near zero moves by more
            // steps than one).
            const double got = std::bit_cast<float>(uint32_t{c[i]} << 16);
            const double ref = std::bit_cast<float>(uint32_t{want[i]} << 16);
            ASSERT_NEAR(got, ref, std::max(std::fabs(got), std::fabs(ref)) / 128 + 4e-6 * (t.k + 2))
                << Describe(t) << " relu " << relu << " at " << i;
          }
        }
      }
      SetGemmEngine(GemmEngine::kAuto);
    }
  }
  EXPECT_EQ(negatives[true], 0u);
  EXPECT_GT(negatives[false], 0u);
}

TEST(GemmDeathTest, ALeadingDimensionShorterThanItsMatrixIsABug) {
  std::vector<uint16_t> a(64, 0), b(64, 0), c(64, 0);
  EXPECT_DEATH(GemmBf16Out(4, 2, 2, {a.data(), 4}, {b.data(), 2}, c.data(), 3, true), "ldc");
  std::vector<float> cf(64, 0.0f);
  EXPECT_DEATH(GemmBf16(4, 2, 2, {a.data(), 3}, {b.data(), 2}, cf.data(), 4, false), "a.ld");
}

TEST(GemmTest, RoundToBf16IsRoundToNearestEven) {
  const float in[] = {1.0f,
                      std::bit_cast<float>(0x3f808000u),  // halfway, even below: down
                      std::bit_cast<float>(0x3f818000u),  // halfway, odd below: up
                      std::bit_cast<float>(0x3f808001u),  // above halfway: up
                      -0.0f,
                      INFINITY,
                      -3.0e38f};
  const uint32_t want[] = {0x3f800000u, 0x3f800000u, 0x3f820000u, 0x3f810000u,
                           0x80000000u, 0x7f800000u, 0xff620000u};
  float out[7];
  RoundToBf16(in, 7, out);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), want[i]) << "input " << i;
  float nan = NAN;
  RoundToBf16(&nan, 1, out);
  EXPECT_TRUE(std::isnan(out[0]));
}

// The ReLU's gradient: every bf16 activation pattern (zeros of both signs,
// subnormals, infinities, NaNs) against the definition, with gradients of
// every kind (a NaN, infinities, negatives, a subnormal).
TEST(GemmTest, MaskByReluKeepsTheGradientWhereTheActivationIsAboveZero) {
  const float grads[] = {1.0f,     -2.5e-3f,  NAN,
                         INFINITY, -INFINITY, std::bit_cast<float>(0x00010000u)};
  constexpr size_t kPatterns = 1u << 16;
  std::vector<uint16_t> h(kPatterns);
  for (size_t i = 0; i < kPatterns; ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<uint16_t> grad(kPatterns);
  size_t kept = 0;
  for (float g : grads) {
    std::fill(grad.begin(), grad.end(), Bf16Bits(g));
    MaskByRelu(h.data(), kPatterns, grad.data());
    for (size_t i = 0; i < kPatterns; ++i) {
      const bool above = std::bit_cast<float>(uint32_t{h[i]} << 16) > 0.0f;
      kept += above;
      ASSERT_EQ(grad[i], above ? Bf16Bits(g) : 0) << "h bits " << i << ", gradient " << g;
    }
  }
  EXPECT_EQ(kept, std::size(grads) * 0x7F80u);  // 0x0001..0x7F80 are above 0
}

TEST(GemmTest, NamesTheEngineItRuns) {
  const std::string fp32 = GemmEngineName(MatmulFormat::kFp32);
  std::printf("fp32: %s\nbf16: %s\n", fp32.c_str(), GemmEngineName(MatmulFormat::kBf16).c_str());
  EXPECT_EQ(fp32.rfind(OneDnnAvailable() ? "oneDNN" : "Eigen", 0), 0u) << fp32;
  SetGemmEngine(GemmEngine::kEigen);
  EXPECT_EQ(GemmEngineName(MatmulFormat::kFp32).rfind("Eigen", 0), 0u);
  SetGemmEngine(GemmEngine::kAuto);
}

}  // namespace
}  // namespace gridsync::cpu
