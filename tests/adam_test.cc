// Adam: two steps against a hand computation, per-row step counts, untouched
// rows, the batched loops against the row-at-a-time one, and the loss
// scaler's skip-and-backoff behaviour.
#include "kernels/cpu/adam.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/row_width.h"
#include "kernels/cpu/adam_batch.h"
#include "worker/loss_scaler.h"

namespace gridsync {
namespace {

TEST(AdamTest, TwoStepsMatchHandComputation) {
  AdamHyper hyper;  // lr 1e-2, b1 0.9, b2 0.99, eps 1e-15
  cpu::AdamTable state;
  state.Resize(4, 1);
  std::vector<float> params = {1.0f, 2.0f, 3.0f, 4.0f};

  SparseRows g1;
  g1.width = 1;
  g1.rows = {1};
  g1.values = {0.5f};
  cpu::AdamUpdateRows(hyper, g1, 1.0f, params.data(), &state);
  // m = 0.05, v = 0.0025, step size = 0.01*sqrt(0.01)/0.1 = 0.01,
  // update = 0.01 * 0.05 / sqrt(0.0025) = 0.01.
  EXPECT_NEAR(params[1], 1.99f, 1e-6f);
  EXPECT_NEAR(state.m[1], 0.05f, 1e-7f);
  EXPECT_NEAR(state.v[1], 0.0025f, 1e-8f);
  EXPECT_EQ(state.step[1], 1u);

  SparseRows g2;
  g2.width = 1;
  g2.rows = {1, 3};
  g2.values = {-0.25f, 0.5f};
  cpu::AdamUpdateRows(hyper, g2, 1.0f, params.data(), &state);
  // Row 1, step 2: m = 0.9*0.05 - 0.1*0.25 = 0.02; v = 0.99*0.0025 + 0.01*0.0625 = 0.0031;
  // step size = 0.01*sqrt(1-0.99^2)/(1-0.9^2) = 0.0074246; update = 0.0074246*0.02/sqrt(0.0031).
  const double step_size = 0.01 * std::sqrt(1 - 0.99 * 0.99) / (1 - 0.9 * 0.9);
  EXPECT_NEAR(params[1], 1.99 - step_size * 0.02 / std::sqrt(0.0031), 2e-6);
  EXPECT_EQ(state.step[1], 2u);
  // Row 3 takes its first step: its own bias correction, not the global one.
  EXPECT_NEAR(params[3], 3.99f, 1e-6f);
  EXPECT_EQ(state.step[3], 1u);
  // Untouched rows: bit-identical, state untouched.
  EXPECT_EQ(params[0], 1.0f);
  EXPECT_EQ(params[2], 3.0f);
  EXPECT_EQ(state.step[0], 0u);
  EXPECT_EQ(state.m[2], 0.0f);
}

// A step count beyond the memo (a long run, or a hostile checkpoint's
// count) is computed with the same bits, and sizes no allocation: a memo
// grown to 2^32 steps would take 16 GiB and minutes of pow() calls.
TEST(AdamTest, StepSizesBeyondTheMemoAreComputedNotMemoised) {
  AdamHyper hyper;
  hyper.beta2 = 0.9999999f;  // bias correction still moving at 2^16 steps
  cpu::AdamTable state;
  for (uint32_t t : {1u, 2u, 1000u, cpu::AdamTable::kMemoSteps - 1, cpu::AdamTable::kMemoSteps,
                     uint32_t{1} << 24, UINT32_MAX - 1, UINT32_MAX}) {
    EXPECT_EQ(state.StepSize(hyper, t), AdamStepSize(hyper, t)) << "step " << t;
    EXPECT_EQ(state.StepSizeAt(hyper, t), AdamStepSize(hyper, t)) << "step " << t;
  }
  state.ReserveSteps(hyper, UINT32_MAX);
  EXPECT_EQ(state.StepSize(hyper, 7), AdamStepSize(hyper, 7));
}

// The step size is what a GPU computes too: every double operation rounded
// on its own (a host compiler that fused the last product of AdamPower into
// 1 - b^t, as GCC does by default, would part from the device's mul.rn and
// sub.rn in the last bit for some t), and as close to the exact value as a
// float holds.
double RoundedEach(double x) {
  volatile double kept = x;  // forces the rounding of each result here
  return kept;
}

float StepSizeRoundedEach(const AdamHyper& h, uint32_t t) {
  auto power = [](double b, uint32_t e) {
    double r = 1.0;
    for (; e != 0; e >>= 1) {
      if (e & 1u) r = RoundedEach(r * b);
      b = RoundedEach(b * b);
    }
    return r;
  };
  const double b2 = power(h.beta2, t), b1 = power(h.beta1, t);
  const double root = RoundedEach(std::sqrt(RoundedEach(1.0 - b2)));
  return static_cast<float>(
      RoundedEach(RoundedEach(double{h.learning_rate} * root) / RoundedEach(1.0 - b1)));
}

TEST(AdamTest, StepSizeRoundsEachOperationAsTheDeviceDoes) {
  std::vector<uint32_t> steps;
  for (uint32_t t = 1; t <= 5000; ++t) steps.push_back(t);
  for (uint32_t t = 5000; t < UINT32_MAX / 3; t = t * 3 + 1) steps.push_back(t);
  steps.push_back(UINT32_MAX);
  AdamHyper defaults, slow;
  slow.learning_rate = 3e-4f;
  slow.beta1 = 0.95f;
  slow.beta2 = 0.9999999f;
  for (const AdamHyper& h : {defaults, slow}) {
    for (uint32_t t : steps) {
      const float got = AdamStepSize(h, t);
      ASSERT_EQ(got, StepSizeRoundedEach(h, t)) << "step " << t << ", beta2 " << h.beta2;
      const long double exact = static_cast<long double>(h.learning_rate) *
                                std::sqrt(1.0L - std::pow(static_cast<long double>(h.beta2), t)) /
                                (1.0L - std::pow(static_cast<long double>(h.beta1), t));
      const auto want = static_cast<float>(exact);
      ASSERT_LE(std::fabs(got - want), std::nextafter(want, 1.0f) - want)
          << "step " << t << ": " << got << " against exactly " << want;
    }
  }
}

TEST(AdamTest, GradScaleUnscalesGradients) {
  AdamHyper hyper;
  cpu::AdamTable a, b;
  a.Resize(1, 2);
  b.Resize(1, 2);
  std::vector<float> pa = {0.5f, -0.5f}, pb = pa;
  SparseRows ga{2, {0}, {0.3f, -0.7f}};
  SparseRows gb{2, {0}, {0.3f * 1024.0f, -0.7f * 1024.0f}};
  cpu::AdamUpdateRows(hyper, ga, 1.0f, pa.data(), &a);
  cpu::AdamUpdateRows(hyper, gb, 1.0f / 1024.0f, pb.data(), &b);
  EXPECT_FLOAT_EQ(pa[0], pb[0]);
  EXPECT_FLOAT_EQ(pa[1], pb[1]);
}

TEST(AdamTest, DenseUpdatesEveryRow) {
  AdamHyper hyper;
  cpu::AdamTable state;
  state.Resize(3, 2);
  std::vector<float> params(6, 1.0f);
  const std::vector<float> grad = {1, -1, 1, -1, 1, -1};
  cpu::AdamUpdateDense(hyper, grad.data(), 3, 1.0f, params.data(), &state);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(params[i], i % 2 == 0 ? 0.99f : 1.01f, 1e-6f);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(state.step[r], 1u);
}

TEST(LossScalerTest, SkipsAndBacksOffThenGrows) {
  LossScaler::Options options;
  options.initial_scale = 1024.0f;
  options.growth_interval = 3;
  LossScaler scaler(true, options);
  EXPECT_FALSE(scaler.Update(false));
  EXPECT_EQ(scaler.scale(), 512.0f);
  EXPECT_EQ(scaler.skipped_steps(), 1u);
  EXPECT_TRUE(scaler.Update(true));
  EXPECT_TRUE(scaler.Update(true));
  EXPECT_EQ(scaler.scale(), 512.0f);
  EXPECT_TRUE(scaler.Update(true));
  EXPECT_EQ(scaler.scale(), 1024.0f);
}

TEST(LossScalerTest, DisabledNeverScales) {
  LossScaler scaler(false);
  EXPECT_EQ(scaler.scale(), 1.0f);
  EXPECT_TRUE(scaler.Update(true));
  EXPECT_EQ(scaler.scale(), 1.0f);
}

}  // namespace
}  // namespace gridsync

namespace gridsync {
namespace {

// RowHasGradient tests magnitude bits on the CPU; it must say what g != 0
// says for every value: +-0 none, NaN, infinities, the smallest subnormal
// and ordinary values one, in any position of any width.
TEST(AdamTest, RowHasGradientIsAnyValueUnequalToZero) {
  const float values[] = {0.0f,
                          -0.0f,
                          std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(),
                          1.0f,
                          -3e-38f};
  for (uint32_t width = 1; width <= 8; ++width) {
    for (float x : values) {
      for (uint32_t at = 0; at < width; ++at) {
        std::vector<float> row(width, at % 2 == 0 ? 0.0f : -0.0f);
        row[at] = x;
        EXPECT_EQ(RowHasGradient(row.data(), width), x != 0.0f)
            << "width " << width << ", value " << x << " at " << at;
      }
    }
  }
}

TEST(AdamTest, ZeroGradientRowsAreSkipped) {
  AdamHyper hyper;
  cpu::AdamTable state;
  state.Resize(3, 2);
  std::vector<float> params = {1, 1, 2, 2, 3, 3};
  // Row 1 is listed but its gradient is exactly zero: no step, no decay.
  SparseRows g{2, {0, 1}, {0.5f, 0.0f, 0.0f, 0.0f}};
  cpu::AdamUpdateRows(hyper, g, 1.0f, params.data(), &state);
  EXPECT_EQ(state.step[0], 1u);
  EXPECT_EQ(state.step[1], 0u);
  EXPECT_EQ(params[2], 2.0f);
  EXPECT_EQ(params[3], 2.0f);
  // A row with one non-zero column steps as a whole.
  EXPECT_NE(params[0], 1.0f);
  EXPECT_EQ(params[1], 1.0f);  // its zero column: m = v = 0 -> no move
  // Dense tables (MLP weights) step every row, as tiny-cuda-nn's matrix
  // weights do: row 0 keeps moving on its momentum with a zero gradient.
  const float moved_before = params[0];
  const std::vector<float> dense = {0, 0, 1, 0, 0, 0};
  cpu::AdamUpdateDense(hyper, dense.data(), 3, 1.0f, params.data(), &state);
  EXPECT_EQ(state.step[0], 2u);
  EXPECT_EQ(state.step[1], 1u);
  EXPECT_EQ(state.step[2], 1u);
  EXPECT_NE(params[0], moved_before);
}

}  // namespace
}  // namespace gridsync

namespace gridsync {
namespace {

// The batched loops (cpu/adam_batch.h: rows loaded 8/width to a vector
// register, sqrt and divide vectorised across rows) must end bit for bit
// where the
// row-at-a-time AdamUpdateRow ends: every width, zero-gradient rows
// skipped, row counts that leave a partly filled batch, a gradient scale,
// and several steps so that m, v and the step counts carry over.
TEST(AdamTest, BatchedRowsEndBitForBitWhereRowAtATimeEnds) {
  AdamHyper hyper;
  hyper.learning_rate = 3e-3f;
  for (uint32_t width : {1u, 2u, 3u, 4u, 8u}) {
    SCOPED_TRACE("width " + std::to_string(width));
    constexpr uint64_t kRows = 1000;
    std::mt19937 rng(width);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> init(kRows * width);
    for (float& x : init) x = normal(rng);
    std::vector<float> p_rows = init, p_indexed = init, p_ref = init;
    cpu::AdamTable s_rows, s_indexed, s_ref;
    s_rows.Resize(kRows, width);
    s_indexed.Resize(kRows, width);
    s_ref.Resize(kRows, width);
    for (int step = 0; step < 5; ++step) {
      const float scale = step % 2 == 0 ? 1.0f : 1.0f / 1024.0f;
      SparseRows grad;
      grad.width = width;
      std::vector<float> dense(kRows * width, 0.0f);
      for (uint32_t row = 0; row < kRows; ++row) {
        if (rng() % 3 == 0) continue;  // untouched
        grad.rows.push_back(row);
        const bool zero = rng() % 7 == 0;  // touched, zero gradient: skipped
        for (uint32_t f = 0; f < width; ++f) {
          const float g = zero ? 0.0f : normal(rng) * (step % 2 == 0 ? 1.0f : 1024.0f);
          grad.values.push_back(g);
          dense[size_t{row} * width + f] = g * scale;
        }
      }
      cpu::AdamUpdateRows(hyper, grad, scale, p_rows.data(), &s_rows);
      cpu::AdamUpdateIndexed(hyper, grad.rows.data(), grad.rows.size(), dense.data(),
                             p_indexed.data(), &s_indexed);
      for (float x : dense) ASSERT_EQ(x, 0.0f) << "AdamUpdateIndexed zeroes its gradient rows";
      for (size_t i = 0; i < grad.rows.size(); ++i) {
        const size_t at = size_t{grad.rows[i]} * width;
        AdamUpdateRow(hyper, width, grad.values.data() + i * width, scale, &p_ref[at], &s_ref.m[at],
                      &s_ref.v[at], &s_ref.step[grad.rows[i]]);
      }
    }
    auto same_bits = [](std::span<const float> a, std::span<const float> b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
    };
    EXPECT_TRUE(same_bits(p_rows, p_ref));
    EXPECT_TRUE(same_bits(s_rows.m, s_ref.m));
    EXPECT_TRUE(same_bits(s_rows.v, s_ref.v));
    EXPECT_EQ(s_rows.step, s_ref.step);
    EXPECT_TRUE(same_bits(p_indexed, p_ref));
    EXPECT_TRUE(same_bits(s_indexed.m, s_ref.m));
    EXPECT_TRUE(same_bits(s_indexed.v, s_ref.v));
    EXPECT_EQ(s_indexed.step, s_ref.step);
    EXPECT_FALSE(same_bits(p_ref, init)) << "the steps moved nothing";
  }
}

// The worker-side optimizer's use of the batch (kNegatedStep: -step into a
// buffer, parameters untouched) must end bit for bit where AdamStep row by
// row ends, including the sign of a zero step, for every width the batch
// takes and for partly filled batches; the in-place form (the buffer is
// the gradient itself, as HostTrainer::GridWorkerAdam uses it) too.
TEST(AdamTest, BatchedNegatedStepsEndBitForBitWhereAdamStepEnds) {
  AdamHyper hyper;
  hyper.learning_rate = 7e-3f;
  auto run = [&](auto constant) {
    constexpr uint32_t W = decltype(constant)::value;
    SCOPED_TRACE("width " + std::to_string(W));
    constexpr uint32_t kRows = 517;  // not a multiple of a batch
    std::mt19937 rng(W + 100);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> m_ref(kRows * W, 0.0f), v_ref(kRows * W, 0.0f);
    std::vector<float> m_out = m_ref, v_out = m_ref, m_in = m_ref, v_in = m_ref;
    for (int step = 1; step <= 4; ++step) {
      std::vector<uint32_t> rows;
      for (uint32_t r = 0; r < kRows; ++r) {
        if (rng() % 4 != 0) rows.push_back(r);
      }
      std::vector<float> grad(kRows * W);
      for (float& g : grad) g = rng() % 9 == 0 ? 0.0f : normal(rng);
      const float lr = AdamStepSize(hyper, static_cast<uint32_t>(step));
      std::vector<float> want(rows.size() * W), got(rows.size() * W, 1.0f);
      std::vector<float> in_place = grad;
      cpu::AdamRowBatch<W, cpu::AdamBatchOut::kNegatedStep> out(hyper, got.data(), m_out.data(),
                                                                v_out.data());
      cpu::AdamRowBatch<W, cpu::AdamBatchOut::kNegatedStep> self(hyper, in_place.data(),
                                                                 m_in.data(), v_in.data());
      for (size_t i = 0; i < rows.size(); ++i) {
        const uint32_t r = rows[i];
        for (uint32_t f = 0; f < W; ++f) {
          const size_t at = size_t{r} * W + f;
          want[i * W + f] = -AdamStep(hyper, lr, grad[at], &m_ref[at], &v_ref[at]);
        }
        out.Add(grad.data() + size_t{r} * W, 1.0f, lr, r, i * W);
        self.Add(in_place.data() + size_t{r} * W, 1.0f, lr, r, size_t{r} * W);
      }
      out.Flush();
      self.Flush();
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "step " << step;
      for (size_t i = 0; i < rows.size(); ++i) {
        ASSERT_EQ(std::memcmp(in_place.data() + size_t{rows[i]} * W, want.data() + i * W, W * 4), 0)
            << "in place, step " << step << ", row " << rows[i];
      }
      ASSERT_EQ(std::memcmp(m_out.data(), m_ref.data(), m_ref.size() * 4), 0);
      ASSERT_EQ(std::memcmp(v_out.data(), v_ref.data(), v_ref.size() * 4), 0);
      ASSERT_EQ(std::memcmp(m_in.data(), m_ref.data(), m_ref.size() * 4), 0);
      ASSERT_EQ(std::memcmp(v_in.data(), v_ref.data(), v_ref.size() * 4), 0);
    }
  };
  run(RowWidthConstant<1>{});
  run(RowWidthConstant<2>{});
  run(RowWidthConstant<4>{});
  run(RowWidthConstant<8>{});
}

}  // namespace
}  // namespace gridsync
