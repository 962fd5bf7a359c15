// The worker's Adam (LocalOptimizer) over slices of the levels' rows: with
// levels smaller than a slice, cut into several slices, and ending inside a
// bitmap word, every thread count ends bit for bit where Adam row by row
// (kernels/adam_math.h) ends, through the bitmap (ApplyTouched) and the
// dense buffer (ApplyDense), with touched rows on both sides of every slice
// boundary; with mixed precision the fp16 working copy follows every row.
#include "worker/local_optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/adam_math.h"
#include "kernels/cpu/half.h"
#include "tests/test_util.h"
#include "worker/model.h"

namespace gridsync {
namespace {

// local_optimizer.cc cuts 2^17 rows per slice. Three levels: a dense one
// smaller than a slice, a dense one of two slices whose last bitmap word is
// partial, and a hashed one of 2^18 rows (two slices).
Config SlicedConfig() {
  Config config;
  config.encoding.n_levels = 3;
  config.encoding.log2_hashmap_size = 18;
  config.encoding.base_resolution = 100;
  config.encoding.per_level_scale = 3.9;
  config.network.n_neurons = 16;
  config.training.device = TrainingDevice::kCpu;
  return config;
}

constexpr uint64_t kSliceRows = uint64_t{1} << 17;

// A step's gradient: per level, random rows (duplicates summed, as the
// backward pass sums them) plus the rows at and around the slice boundary
// and the level's last row; some rows get an all-zero gradient, which Adam
// must skip.
struct StepGradient {
  std::vector<std::vector<uint32_t>> rows;  // per level, as added
  std::vector<std::vector<float>> values;   // per level, rows x features
  std::vector<std::vector<float>> mlp;      // per matrix
};

StepGradient MakeGradient(const HashGridModel& model, uint64_t seed) {
  const auto& layout = model.layout();
  const uint32_t F = layout.features();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(-1e-2f, 1e-2f);
  StepGradient g;
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    const uint32_t rows = static_cast<uint32_t>(layout.level(l).rows);
    std::uniform_int_distribution<uint32_t> row(0, rows - 1);
    std::vector<uint32_t> ids;
    for (const uint64_t id : {uint64_t{0}, uint64_t{63}, uint64_t{64}, kSliceRows - 1, kSliceRows,
                              kSliceRows + 1, uint64_t{rows} - 1}) {
      if (id < rows) ids.push_back(static_cast<uint32_t>(id));
    }
    for (int i = 0; i < 20000; ++i) ids.push_back(row(rng));
    std::vector<float> values(ids.size() * F);
    for (size_t i = 0; i < ids.size(); ++i) {
      const bool zero = i % 97 == 5;
      for (uint32_t f = 0; f < F; ++f) values[i * F + f] = zero ? 0.0f : value(rng);
    }
    g.rows.push_back(std::move(ids));
    g.values.push_back(std::move(values));
  }
  for (const auto& m : model.mlp_weights()) {
    std::vector<float> v(static_cast<size_t>(m.size()));
    for (float& x : v) x = value(rng);
    g.mlp.push_back(std::move(v));
  }
  return g;
}

void FillGradients(const StepGradient& g, ModelGradients* grads) {
  for (uint32_t l = 0; l < g.rows.size(); ++l)
    grads->grid.AddRows(l, g.rows[l].data(), g.rows[l].size(), g.values[l].data());
  for (size_t i = 0; i < g.mlp.size(); ++i)
    std::copy(g.mlp[i].begin(), g.mlp[i].end(), grads->mlp[i].data());
}

// Adam row by row on the grid (the reference): every row with a non-zero
// summed gradient steps once.
struct RowCounts {
  uint64_t touched = 0;  // rows given a gradient (ApplyTouched reports these)
  uint64_t updated = 0;  // of those, rows whose sum is not zero (ApplyDense)
};

RowCounts ReferenceStep(const StepGradient& g, HashGridModel* model,
                        std::vector<cpu::AdamTable>* state, const AdamHyper& hyper) {
  const auto& layout = model->layout();
  const uint32_t F = layout.features();
  RowCounts counts;
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    auto& table = (*state)[l];
    std::vector<float> sum(layout.level(l).rows * F, 0.0f);
    std::set<uint32_t> touched;
    for (size_t i = 0; i < g.rows[l].size(); ++i) {
      for (uint32_t f = 0; f < F; ++f) sum[size_t{g.rows[l][i]} * F + f] += g.values[l][i * F + f];
      touched.insert(g.rows[l][i]);
    }
    float* params = model->grid_params().data() + layout.level(l).row_offset * F;
    for (uint32_t r : touched) {
      const size_t at = size_t{r} * F;
      counts.updated += AdamUpdateRow(hyper, F, &sum[at], 1.0f, &params[at], &table.m[at],
                                      &table.v[at], &table.step[r]);
    }
    counts.touched += touched.size();
  }
  return counts;
}

std::unique_ptr<HashGridModel> MakeModel(const Config& config) {
  auto model = HashGridModel::Create(testing::SpecOf(config).model);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return nullptr;
  return std::move(*model);
}

TEST(LocalOptimizerTest, SlicedLevelsEndWhereRowByRowAdamEnds) {
  Config config = SlicedConfig();
  const AdamHyper hyper;
  for (const bool half : {false, true}) {
    for (const bool dense : {false, true}) {
      for (const int threads : {1, 3}) {
        SCOPED_TRACE(::testing::Message() << (dense ? "ApplyDense" : "ApplyTouched") << ", "
                                          << threads << " threads" << (half ? ", fp16 copy" : ""));
        config.training.mixed_precision = half;
        auto model = MakeModel(config);
        ASSERT_NE(model, nullptr);
        auto expected = MakeModel(config);
        ASSERT_NE(expected, nullptr);
        const auto& layout = model->layout();
        ASSERT_LT(layout.level(0).rows, kSliceRows);
        ASSERT_GT(layout.level(1).rows, kSliceRows);
        ASSERT_NE(layout.level(1).rows % 64, 0u);
        ASSERT_TRUE(layout.level(2).hashed);
        ASSERT_EQ(layout.level(2).rows, 2 * kSliceRows);
        std::vector<cpu::AdamTable> expected_state(layout.n_levels());
        for (uint32_t l = 0; l < layout.n_levels(); ++l)
          expected_state[l].Resize(layout.level(l).rows, layout.features());
        ThreadPool pool(threads);
        LocalOptimizer optimizer(model.get(), hyper);
        ModelGradients grads(model->layout(), model->mlp_shape());
        for (uint64_t step = 0; step < 3; ++step) {
          const StepGradient g = MakeGradient(*model, 100 + step);
          FillGradients(g, &grads);
          const uint64_t updated =
              dense ? optimizer.ApplyDense(grads.grid.mutable_dense(), &grads.mlp, 1.0f, &pool)
                    : optimizer.ApplyTouched(&grads, &pool);
          if (dense) grads.grid.ForgetTouched();
          const RowCounts counts = ReferenceStep(g, expected.get(), &expected_state, hyper);
          EXPECT_EQ(updated, dense ? counts.updated : counts.touched) << "step " << step;
          EXPECT_LT(counts.updated, counts.touched) << "the gradient has all-zero rows";
          // Both paths leave the gradient buffer zeroed for the next step.
          const auto& buffer = grads.grid.dense_span();
          EXPECT_TRUE(std::all_of(buffer.begin(), buffer.end(), [](float x) { return x == 0.0f; }))
              << "step " << step;
        }
        testing::ExpectBitIdentical(model->grid_params(), expected->grid_params());
        if (half) {
          // Every row Adam moved is in the working copy the forward pass reads.
          const auto& copy = model->grid_working_copy();
          ASSERT_EQ(copy.size(), model->grid_params().size());
          size_t stale = 0;
          for (size_t i = 0; i < copy.size(); ++i)
            stale += copy[i] != FloatToHalf(model->grid_params()[i]);
          EXPECT_EQ(stale, 0u) << "fp16 working copy values behind the parameters";
        }
        for (uint32_t l = 0; l < expected_state.size(); ++l) {
          EXPECT_EQ(optimizer.grid_state()[l].step, expected_state[l].step) << "level " << l;
          EXPECT_EQ(optimizer.grid_state()[l].m, expected_state[l].m) << "level " << l;
          EXPECT_EQ(optimizer.grid_state()[l].v, expected_state[l].v) << "level " << l;
        }
      }
    }
  }
}

// The standalone loop's path (GradientSync::applies_compact_gradients):
// AccumulateGradients into a compact grid gradient, then ApplyTouched, ends
// bit for bit where the dense buffer ends, over three steps of a real batch
// on 1 and 3 threads, and leaves the gradient clear and dense again.
TEST(LocalOptimizerTest, CompactGradientEndsWhereTheDenseBufferEnds) {
  const Config config = SlicedConfig();
  const AdamHyper hyper;
  for (const int threads : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    auto dense_model = MakeModel(config);
    auto compact_model = MakeModel(config);
    ASSERT_NE(dense_model, nullptr);
    ASSERT_NE(compact_model, nullptr);
    ThreadPool pool(threads);
    LocalOptimizer dense_optimizer(dense_model.get(), hyper);
    LocalOptimizer compact_optimizer(compact_model.get(), hyper);
    ModelGradients dense(dense_model->layout(), dense_model->mlp_shape());
    ModelGradients compact(compact_model->layout(), compact_model->mlp_shape());
    compact.compact_grid = true;
    const size_t n = 3000;
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    for (uint64_t step = 0; step < 3; ++step) {
      std::vector<float> positions(n * 2), targets(n * 3);
      for (float& x : positions) x = unit(rng);
      for (float& x : targets) x = unit(rng);
      const uint32_t levels = dense_model->layout().n_levels();
      const double sse_dense = dense_model->AccumulateGradients(positions.data(), targets.data(), n,
                                                                n, 1.0f, levels, &dense, &pool);
      const double sse_compact = compact_model->AccumulateGradients(
          positions.data(), targets.data(), n, n, 1.0f, levels, &compact, &pool);
      EXPECT_EQ(sse_dense, sse_compact) << "step " << step;
      ASSERT_TRUE(compact.grid.compact());
      const uint64_t dense_rows = dense_optimizer.ApplyTouched(&dense, &pool);
      const uint64_t compact_rows = compact_optimizer.ApplyTouched(&compact, &pool);
      EXPECT_EQ(compact_rows, dense_rows) << "step " << step;
      EXPECT_GT(compact_rows, 0u);
      EXPECT_FALSE(compact.grid.compact()) << "step " << step;
      for (uint32_t l = 0; l < levels; ++l)
        EXPECT_EQ(compact.grid.TouchedRows(l), 0u) << "step " << step << " level " << l;
    }
    testing::ExpectBitIdentical(compact_model->grid_params(), dense_model->grid_params());
    for (size_t i = 0; i < dense_model->mlp_weights().size(); ++i) {
      const auto& a = compact_model->mlp_weights()[i];
      const auto& b = dense_model->mlp_weights()[i];
      testing::ExpectBitIdentical(std::vector<float>(a.data(), a.data() + a.size()),
                                  std::vector<float>(b.data(), b.data() + b.size()));
    }
    for (uint32_t l = 0; l < dense_optimizer.grid_state().size(); ++l) {
      EXPECT_EQ(compact_optimizer.grid_state()[l].step, dense_optimizer.grid_state()[l].step);
      EXPECT_EQ(compact_optimizer.grid_state()[l].m, dense_optimizer.grid_state()[l].m);
      EXPECT_EQ(compact_optimizer.grid_state()[l].v, dense_optimizer.grid_state()[l].v);
    }
  }
}

}  // namespace
}  // namespace gridsync
