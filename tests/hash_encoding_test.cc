// Hash encoding: level geometry and hash values against hand-computed cases,
// forward against a direct evaluation, and finite-difference gradients.
#include "kernels/cpu/hash_encoding.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/half.h"
#include "kernels/hash_grid_layout.h"

namespace gridsync {
namespace {

HashGridLayout MakeLayout(uint32_t dims, uint32_t levels, uint32_t features, uint32_t log2_size,
                          uint32_t base = 16, float scale = 1.5f) {
  HashGridSpec spec{dims, levels, features, log2_size, base, scale};
  auto layout = HashGridLayout::Make(spec);
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  return *layout;
}

TEST(HashGridLayoutTest, SeedSmallLevelsMatchHandComputation) {
  // scale_l = 16 * 1.5^l - 1, res = ceil(scale) + 1; dense while res^2 <= 2^19,
  // padded to a multiple of 8 (e.g. 54^2 = 2916 -> 2920).
  const HashGridLayout layout = MakeLayout(2, 16, 2, 19);
  const uint32_t expected_res[16] = {16,  24,  36,  54,   81,   122,  183,  274,
                                     411, 616, 923, 1384, 2076, 3114, 4671, 7007};
  const uint32_t expected_rows[10] = {256,   576,   1296,  2920,   6568,
                                      14888, 33496, 75080, 168928, 379456};
  uint64_t offset = 0;
  for (uint32_t l = 0; l < 16; ++l) {
    const auto& level = layout.level(l);
    EXPECT_EQ(level.resolution, expected_res[l]) << "level " << l;
    EXPECT_EQ(level.row_offset, offset) << "level " << l;
    if (l < 10) {
      EXPECT_FALSE(level.hashed) << "level " << l;
      EXPECT_EQ(level.rows, expected_rows[l]) << "level " << l;
    } else {
      EXPECT_TRUE(level.hashed) << "level " << l;
      EXPECT_EQ(level.rows, 1u << 19) << "level " << l;
    }
    offset += level.rows;
  }
  EXPECT_EQ(layout.total_rows(), offset);
  // The design's figure: about 7.7M parameters for the 2D seed-small grid.
  EXPECT_EQ(layout.total_params(), 2 * offset);
  EXPECT_NEAR(static_cast<double>(layout.total_params()), 7.66e6, 0.01e6);
}

TEST(HashGridLayoutTest, RejectsUnsupportedSpecs) {
  EXPECT_FALSE(HashGridLayout::Make({4, 16, 2, 19, 16, 1.5f}).ok());
  EXPECT_FALSE(HashGridLayout::Make({2, 0, 2, 19, 16, 1.5f}).ok());
  EXPECT_FALSE(HashGridLayout::Make({2, 16, 3, 19, 16, 1.5f}).ok());
  EXPECT_FALSE(HashGridLayout::Make({2, 16, 2, 31, 16, 1.5f}).ok());
  EXPECT_FALSE(HashGridLayout::Make({2, 16, 2, 19, 16, 0.5f}).ok());
}

TEST(HashGridMathTest, HashValuesMatchHandComputation) {
  const uint32_t c2[2] = {3, 5};
  // 5 * 2654435761 mod 2^32 = 387276917; ^ 3 = 387276918.
  EXPECT_EQ(GridHash<2>(c2), 387276918u);
  const uint32_t c2b[2] = {7, 11};
  EXPECT_EQ(GridHash<2>(c2b), 3428989596u);
  const uint32_t c3[3] = {1, 2, 3};
  // 1 ^ (2*2654435761 mod 2^32) ^ (3*805459861 mod 2^32), then mod 2^12 = 1500.
  GridLevelInfo hashed{0, 0.0f, 100, 1u << 12, 1};
  EXPECT_EQ(GridRow<3>(hashed, c3), 1500u);
  GridLevelInfo hashed19{0, 0.0f, 1000, 1u << 19, 1};
  EXPECT_EQ(GridRow<2>(hashed19, c2), 352374u);
  // Dense: x + y*res (+ z*res^2), wrapped by the level size past the last line.
  GridLevelInfo dense{0, 15.0f, 16, 256, 0};
  const uint32_t d[2] = {8, 4};
  EXPECT_EQ(GridRow<2>(dense, d), 72u);
  const uint32_t past[2] = {16, 15};
  EXPECT_EQ(GridRow<2>(dense, past), (16u + 15u * 16u) % 256u);
  GridLevelInfo dense3{0, 3.0f, 4, 64, 0};
  const uint32_t d3[3] = {1, 2, 3};
  EXPECT_EQ(GridRow<3>(dense3, d3), 1u + 2u * 4u + 3u * 16u);
}

TEST(HashGridMathTest, LookupCornersAndWeights) {
  // Level 0 of seed-small: scale 15. Position (0.5, 0.25) maps to (8.0, 4.25).
  GridLevelInfo level{0, 15.0f, 16, 256, 0};
  const float p[2] = {0.5f, 0.25f};
  GridCorners<2> c;
  GridLookup<2>(level, p, &c);
  EXPECT_EQ(c.row[0], 72u);  // (8,4)
  EXPECT_EQ(c.row[1], 73u);  // (9,4)
  EXPECT_EQ(c.row[2], 88u);  // (8,5)
  EXPECT_EQ(c.row[3], 89u);  // (9,5)
  EXPECT_FLOAT_EQ(c.weight[0], 0.75f);
  EXPECT_FLOAT_EQ(c.weight[1], 0.0f);
  EXPECT_FLOAT_EQ(c.weight[2], 0.25f);
  EXPECT_FLOAT_EQ(c.weight[3], 0.0f);
}

std::vector<float> RandomVector(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Forward against a direct per-sample evaluation of the definition. The
// lookup and the forward pass cut a level's samples into ranges of 4096
// (hash_encoding.cc): 8449 samples make two full ranges and a partial one.
void CheckForward(uint32_t dims, uint32_t features, size_t n, int threads) {
  const HashGridLayout layout = MakeLayout(dims, 8, features, 10, 4, 1.7f);
  const auto positions = RandomVector(n * dims, 1, 0.0f, 1.0f);
  const auto params = RandomVector(layout.total_params(), 2);
  ThreadPool pool(threads);
  cpu::GridBatchLookup lookup;
  cpu::HashGridLookup(layout, positions.data(), n, layout.n_levels(), &lookup, &pool);
  std::vector<float> features_out(n * layout.output_width());
  cpu::HashGridForward(layout, lookup, params.data(), features_out.data(), &pool);
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t l = 0; l < layout.n_levels(); ++l) {
      const auto& level = layout.level(l);
      std::vector<double> pos(dims), frac(dims);
      std::vector<uint32_t> base(dims);
      for (uint32_t d = 0; d < dims; ++d) {
        const float x = std::fma(level.scale, positions[i * dims + d], 0.5f);
        base[d] = static_cast<uint32_t>(std::floor(x));
        frac[d] = x - std::floor(x);
      }
      for (uint32_t f = 0; f < features; ++f) {
        double expected = 0;
        for (uint32_t c = 0; c < (1u << dims); ++c) {
          double w = 1;
          uint32_t coord[3];
          for (uint32_t d = 0; d < dims; ++d) {
            const bool up = (c >> d) & 1u;
            w *= up ? frac[d] : 1 - frac[d];
            coord[d] = base[d] + up;
          }
          uint64_t row;
          if (level.hashed) {
            uint32_t h = coord[0] ^ (coord[1] * 2654435761u);
            if (dims == 3) h ^= coord[2] * 805459861u;
            row = h % level.rows;
          } else {
            uint64_t idx = coord[0] + uint64_t{coord[1]} * level.resolution;
            if (dims == 3) idx += uint64_t{coord[2]} * level.resolution * level.resolution;
            row = idx % level.rows;
          }
          expected += w * params[(level.row_offset + row) * features + f];
        }
        EXPECT_NEAR(features_out[i * layout.output_width() + l * features + f], expected, 1e-5)
            << "dims " << dims << " sample " << i << " level " << l;
      }
    }
  }
}

TEST(HashEncodingTest, Forward2DMatchesDefinition) { CheckForward(2, 2, 257, 2); }
TEST(HashEncodingTest, Forward3DMatchesDefinition) { CheckForward(3, 4, 257, 2); }
TEST(HashEncodingTest, ForwardOverSeveralSampleRangesMatchesDefinition) {
  for (const int threads : {1, 3}) {
    CheckForward(2, 2, 8449, threads);
    CheckForward(3, 1, 8449, threads);
  }
}

// The encoding is linear in its parameters, so a central difference of
// L = sum(c * features) is exact up to float rounding; the check still
// catches wrong rows, weights, levels or missing touches.
// The gradient of L = sum(c * features) over n random positions, with its
// lookup and c.
struct BatchGradient {
  BatchGradient(const HashGridLayout& layout, uint32_t dims, size_t n, uint64_t positions_seed,
                uint64_t c_seed, ThreadPool* pool)
      : c(RandomVector(n * layout.output_width(), c_seed)), grad(layout) {
    const auto positions = RandomVector(n * dims, positions_seed, 0.0f, 1.0f);
    cpu::HashGridLookup(layout, positions.data(), n, layout.n_levels(), &lookup, pool);
    grad.Accumulate(lookup, c.data(), pool);
  }
  std::vector<float> c;
  cpu::GridBatchLookup lookup;
  cpu::GridGradient grad;
};

void CheckGradient(uint32_t dims) {
  const HashGridLayout layout = MakeLayout(dims, 6, 2, 9, 4, 1.8f);
  const size_t n = 64;
  auto params = RandomVector(layout.total_params(), 4);
  ThreadPool pool(1);
  BatchGradient batch(layout, dims, n, 3, 5, &pool);
  const auto& c = batch.c;
  const auto& lookup = batch.lookup;
  auto& grad = batch.grad;

  auto loss = [&]() {
    std::vector<float> out(n * layout.output_width());
    cpu::HashGridForward(layout, lookup, params.data(), out.data(), &pool);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += static_cast<double>(c[i]) * out[i];
    return l;
  };
  uint64_t touched_total = 0;
  for (uint32_t level = 0; level < layout.n_levels(); ++level) {
    SparseRows rows;
    grad.Extract(level, &rows);
    ASSERT_EQ(rows.rows.size(), grad.TouchedRows(level));
    touched_total += rows.size();
    for (size_t k = 1; k < rows.rows.size(); ++k) ASSERT_LT(rows.rows[k - 1], rows.rows[k]);
    // Check a sample of rows plus one untouched row per level.
    for (size_t k = 0; k < rows.rows.size(); k += 7) {
      for (uint32_t f = 0; f < 2; ++f) {
        const size_t at = (layout.level(level).row_offset + rows.rows[k]) * 2 + f;
        const float saved = params[at];
        const float eps = 1e-2f;
        params[at] = saved + eps;
        const double up = loss();
        params[at] = saved - eps;
        const double down = loss();
        params[at] = saved;
        EXPECT_NEAR(rows.values[k * 2 + f], (up - down) / (2 * eps), 2e-3)
            << "dims " << dims << " level " << level << " row " << rows.rows[k];
      }
    }
  }
  EXPECT_GT(touched_total, 0u);
  // Untouched rows of the dense buffer are exactly zero.
  size_t nonzero = 0;
  for (uint64_t i = 0; i < layout.total_params(); ++i) nonzero += grad.dense()[i] != 0.0f;
  EXPECT_LE(nonzero, touched_total * 2);
  grad.Clear(&pool);
  for (uint32_t level = 0; level < layout.n_levels(); ++level)
    EXPECT_EQ(grad.TouchedRows(level), 0u);
  for (uint64_t i = 0; i < layout.total_params(); ++i) ASSERT_EQ(grad.dense()[i], 0.0f);
}

TEST(HashEncodingTest, FiniteDifferenceGradient2D) { CheckGradient(2); }
TEST(HashEncodingTest, FiniteDifferenceGradient3D) { CheckGradient(3); }

// Take hands over what Extract reads, then leaves the level as untouched:
// its rows and the dense buffer at zero, for the smallest, the usual and
// the widest row.
TEST(HashEncodingTest, TakeEqualsExtractAndClearsTheLevel) {
  for (uint32_t features : {1u, 2u, 8u}) {
    const HashGridLayout layout = MakeLayout(2, 5, features, 9, 4, 1.8f);
    ThreadPool pool(2);
    BatchGradient batch(layout, 2, 200, 11, 12, &pool);
    cpu::GridGradient& grad = batch.grad;
    for (uint32_t level = 0; level < layout.n_levels(); ++level) {
      SparseRows read, taken;
      grad.Extract(level, &read);
      ASSERT_GT(read.size(), 0u) << level;
      grad.Take(level, &taken);
      EXPECT_EQ(taken.width, features);
      EXPECT_EQ(taken.rows, read.rows) << "features " << features << " level " << level;
      ASSERT_EQ(taken.values.size(), read.rows.size() * features);
      for (size_t i = 0; i < taken.values.size(); ++i) {
        ASSERT_EQ(taken.values[i], read.values[i]) << "features " << features << " at " << i;
      }
      EXPECT_EQ(grad.TouchedRows(level), 0u);
    }
    for (uint64_t i = 0; i < layout.total_params(); ++i)
      ASSERT_EQ(grad.dense()[i], 0.0f) << "features " << features << " at " << i;
  }
}

// The compact gradient holds the dense one's touched rows in row order, bit
// for bit, from any multiple of 64 on (the unit LocalOptimizer slices by),
// for every row width, 2-D and 3-D, 1 or 2 threads, with inactive levels
// (no rows, no values); Take hands it over as the dense one's; and a
// cleared one accumulates densely again.
TEST(HashEncodingTest, CompactAccumulationHoldsTheDenseSumsInRowOrder) {
  for (const uint32_t dims : {2u, 3u}) {
    for (const uint32_t features : {1u, 2u, 4u, 8u}) {
      for (const size_t threads : {size_t{1}, size_t{2}}) {
        SCOPED_TRACE(::testing::Message()
                     << dims << "-D, " << features << " features, " << threads << " threads");
        const HashGridLayout layout = MakeLayout(dims, 7, features, 12, 4, 2.0f);
        ThreadPool pool(threads);
        const size_t n = 5000;
        const auto positions = RandomVector(n * dims, 21, 0.0f, 1.0f);
        const auto d = RandomVector(n * layout.output_width(), 22);
        const uint32_t active = 5;
        cpu::GridBatchLookup lookup;
        cpu::HashGridLookup(layout, positions.data(), n, active, &lookup, &pool);
        cpu::GridGradient dense(layout), compact(layout);
        dense.Accumulate(lookup, d.data(), &pool);
        compact.AccumulateCompact(lookup, d.data(), &pool);
        ASSERT_TRUE(compact.compact());
        ASSERT_FALSE(dense.compact());
        int spans_words = 0;
        for (uint32_t level = 0; level < layout.n_levels(); ++level) {
          SparseRows expected;
          dense.Extract(level, &expected);
          ASSERT_EQ(compact.TouchedRows(level), expected.size()) << "level " << level;
          if (level >= active) {
            EXPECT_EQ(expected.size(), 0u);
            EXPECT_EQ(compact.CompactValues(level, 0), nullptr) << "level " << level;
            continue;
          }
          ASSERT_GT(expected.size(), 0u) << "level " << level;
          spans_words += expected.rows.back() >= 128;
          const uint64_t rows = layout.level(level).rows;
          // Ranges starting at 0, at a word inside the level, and at its
          // last word: each range's rows and values as Extract has them.
          const uint64_t middle = (rows / 2) / 64 * 64;
          const uint64_t last = (rows - 1) / 64 * 64;
          size_t at = 0;
          for (const auto& [begin, end] : std::vector<std::pair<uint64_t, uint64_t>>{
                   {0, middle}, {middle, last}, {last, rows}}) {
            const float* values = compact.CompactValues(level, begin);
            std::vector<uint32_t> taken;
            compact.TakeRowIds(level, begin, end, &taken);
            ASSERT_LE(at + taken.size(), expected.size());
            for (size_t i = 0; i < taken.size(); ++i, ++at) {
              ASSERT_EQ(taken[i], expected.rows[at]) << "level " << level << " range " << begin;
              for (uint32_t f = 0; f < features; ++f) {
                ASSERT_EQ(std::bit_cast<uint32_t>(values[i * features + f]),
                          std::bit_cast<uint32_t>(expected.values[at * features + f]))
                    << "level " << level << " row " << taken[i] << " feature " << f;
              }
            }
          }
          EXPECT_EQ(at, expected.size()) << "level " << level;
          EXPECT_EQ(compact.TouchedRows(level), 0u) << "level " << level;
        }
        EXPECT_GE(spans_words, 2) << "levels whose rows span several bitmap words";
        // Take (TakeGradients' way) copies a compact level whole, in order.
        cpu::GridGradient taken(layout);
        taken.AccumulateCompact(lookup, d.data(), &pool);
        for (uint32_t level = 0; level < layout.n_levels(); ++level) {
          SparseRows expected, got;
          dense.Extract(level, &expected);
          taken.Take(level, &got);
          EXPECT_EQ(got.width, features);
          EXPECT_EQ(got.rows, expected.rows) << "level " << level;
          ASSERT_EQ(got.values.size(), expected.values.size()) << "level " << level;
          for (size_t i = 0; i < got.values.size(); ++i) {
            ASSERT_EQ(std::bit_cast<uint32_t>(got.values[i]),
                      std::bit_cast<uint32_t>(expected.values[i]))
                << "level " << level << " at " << i;
          }
          EXPECT_EQ(taken.TouchedRows(level), 0u) << "level " << level;
        }
        compact.Clear(&pool);
        EXPECT_FALSE(compact.compact());
        compact.Accumulate(lookup, d.data(), &pool);
        for (uint64_t i = 0; i < layout.total_params(); ++i)
          ASSERT_EQ(compact.dense()[i], dense.dense()[i]) << "at " << i;
      }
    }
  }
}

// A compact gradient has no dense buffer: reading or adding to one is a bug
// the gradient stops on, naming it, rather than sums read as zeros.
TEST(HashEncodingDeathTest, CompactGradientRefusesTheDenseReaders) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const HashGridLayout layout = MakeLayout(2, 3, 2, 10);
  ThreadPool pool(1);
  const auto positions = RandomVector(2 * 100, 31, 0.0f, 1.0f);
  const auto d = RandomVector(100 * layout.output_width(), 32);
  cpu::GridBatchLookup lookup;
  cpu::HashGridLookup(layout, positions.data(), 100, layout.n_levels(), &lookup, &pool);
  cpu::GridGradient grad(layout);
  grad.AccumulateCompact(lookup, d.data(), &pool);
  EXPECT_DEATH(grad.dense(), "compact gradient has no dense buffer");
  EXPECT_DEATH(grad.AccumulateCompact(lookup, d.data(), &pool), "compact gradient");
  EXPECT_DEATH(grad.Accumulate(lookup, d.data(), &pool), "compact gradient");
  const uint32_t row = 0;
  const float values[2] = {1.0f, 2.0f};
  EXPECT_DEATH(grad.AddRows(0, &row, 1, values), "compact gradient");
  cpu::GridGradient dense(layout);
  EXPECT_DEATH(dense.AddFrom(&grad, &pool), "compact gradient");
}

TEST(HashEncodingTest, InactiveLevelsOutputZeroAndGetNoGradient) {
  const HashGridLayout layout = MakeLayout(2, 8, 2, 12);
  // Three of the forward pass's 4096-sample ranges, the last one partial.
  const size_t n = 8449;
  const auto positions = RandomVector(n * 2, 6, 0.0f, 1.0f);
  const auto params = RandomVector(layout.total_params(), 7);
  ThreadPool pool(2);
  cpu::GridBatchLookup lookup;
  cpu::HashGridLookup(layout, positions.data(), n, 3, &lookup, &pool);
  std::vector<float> out(n * layout.output_width(), 42.0f);
  cpu::HashGridForward(layout, lookup, params.data(), out.data(), &pool);
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t l = 0; l < 8; ++l) {
      for (uint32_t f = 0; f < 2; ++f) {
        const float v = out[i * 16 + l * 2 + f];
        if (l >= 3)
          EXPECT_EQ(v, 0.0f);
        else
          EXPECT_NE(v, 0.0f);
      }
    }
  }
  const std::vector<float> ones(n * layout.output_width(), 1.0f);
  cpu::GridGradient grad(layout);
  grad.Accumulate(lookup, ones.data(), &pool);
  for (uint32_t l = 0; l < 8; ++l) {
    if (l < 3)
      EXPECT_GT(grad.TouchedRows(l), 0u);
    else
      EXPECT_EQ(grad.TouchedRows(l), 0u);
  }
}

TEST(HashEncodingTest, HalfParamsForwardMatchesRoundedFloat) {
  const HashGridLayout layout = MakeLayout(2, 4, 2, 10);
  const size_t n = 50;
  const auto positions = RandomVector(n * 2, 8, 0.0f, 1.0f);
  auto params = RandomVector(layout.total_params(), 9);
  std::vector<uint16_t> half(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    half[i] = FloatToHalf(params[i]);
    params[i] = HalfToFloat(half[i]);
  }
  ThreadPool pool(1);
  cpu::GridBatchLookup lookup;
  cpu::HashGridLookup(layout, positions.data(), n, 4, &lookup, &pool);
  std::vector<float> a(n * 8), b(n * 8);
  cpu::HashGridForward(layout, lookup, params.data(), a.data(), &pool);
  cpu::HashGridForward(layout, lookup, half.data(), b.data(), &pool);
  EXPECT_EQ(a, b);
}

TEST(HalfTest, ConversionRoundTripsAndOverflows) {
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f)), 1.0f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(70000.0f))));
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_NEAR(RoundToHalf(0.1f), 0.1f, 1e-4f);
  EXPECT_NE(RoundToHalf(0.1f), 0.1f);
}

}  // namespace
}  // namespace gridsync
