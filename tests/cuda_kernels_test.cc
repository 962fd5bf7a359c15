// The CUDA kernels against their CPU twins (kernels/cpu): hash-grid forward
// in fp32 and fp16, backward into the dense gradient, switched-off levels,
// and sparse Adam. Every GPU test skips, printing why, where
// cuda::Available() is false (no nvcc at configure time, or no device), so
// the suite passes on CPU-only CI; two tests run everywhere: the API fails
// with a Status rather than crashing when there is no GPU path, and the host
// API rejects bad sizes before it touches the device.
#include "kernels/cuda/cuda_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/sparse_rows.h"
#include "common/thread_pool.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/hash_encoding.h"
#include "kernels/hash_grid_layout.h"

namespace gridsync {
namespace {

constexpr uint32_t kLevels = 8;
constexpr size_t kSamples = 1000;

struct Shape {
  uint32_t dims;
  uint32_t features;
  uint32_t base_resolution;  // chosen so that some levels are dense, some hashed
};

void PrintTo(const Shape& shape, std::ostream* os) {
  *os << shape.dims << "D, " << shape.features << " features, base resolution "
      << shape.base_resolution;
}

std::string ShapeName(const testing::TestParamInfo<Shape>& info) {
  return std::to_string(info.param.dims) + "d_f" + std::to_string(info.param.features);
}

HashGridLayout MakeLayout(const Shape& shape) {
  HashGridSpec spec;
  spec.dims = shape.dims;
  spec.n_levels = kLevels;
  spec.features = shape.features;
  spec.log2_hashmap_size = 12;
  spec.base_resolution = shape.base_resolution;
  spec.per_level_scale = 1.5f;
  Result<HashGridLayout> layout = HashGridLayout::Make(spec);
  if (!layout.ok()) {
    ADD_FAILURE() << layout.status().ToString();
    return HashGridLayout();
  }
  return std::move(layout).value();
}

std::vector<float> Uniform(size_t n, float lo, float hi, std::mt19937* rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(n);
  for (float& x : out) x = dist(*rng);
  return out;
}

// Random positions in [0,1)^dims, the first ones on the domain's corners
// (0 and exactly 1, the grid line whose +1 corner wraps in dense levels).
std::vector<float> Positions(uint32_t dims, std::mt19937* rng) {
  std::vector<float> positions = Uniform(kSamples * dims, 0.0f, 1.0f, rng);
  for (uint32_t corner = 0; corner < (1u << dims); ++corner) {
    for (uint32_t d = 0; d < dims; ++d)
      positions[corner * dims + d] = (corner >> d) & 1u ? 1.0f : 0.0f;
  }
  return positions;
}

cpu::GridBatchLookup CpuLookup(const HashGridLayout& layout, const std::vector<float>& positions,
                               uint32_t active_levels, ThreadPool* pool) {
  cpu::GridBatchLookup lookup;
  cpu::HashGridLookup(layout, positions.data(), positions.size() / layout.spec().dims,
                      active_levels, &lookup, pool);
  return lookup;
}

// got[i] within rel * (1 + scale[i]) of want[i]; scale defaults to |want|.
void ExpectAllNear(const std::vector<float>& got, const std::vector<float>& want, float rel,
                   const std::string& what, const std::vector<float>* scale = nullptr) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float s = scale != nullptr ? (*scale)[i] : std::fabs(want[i]);
    if (std::fabs(got[i] - want[i]) <= rel * (1.0f + s)) continue;
    if (bad < 5) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
    ++bad;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " differ";
}

bool IsPositiveZero(float x) { return std::bit_cast<uint32_t>(x) == 0u; }

class CudaHashGridTest : public testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    layout_ = MakeLayout(GetParam());
    bool dense = false;
    bool hashed = false;
    for (const GridLevelInfo& level : layout_.levels()) (level.hashed ? hashed : dense) = true;
    ASSERT_TRUE(dense && hashed) << "the layout should mix dense and hashed levels:\n"
                                 << layout_.Describe();
    positions_ = Positions(GetParam().dims, &rng_);
    params_ = Uniform(layout_.total_params(), -1.0f, 1.0f, &rng_);
  }

  uint32_t F() const { return layout_.features(); }
  uint32_t Width() const { return layout_.output_width(); }

  // Checks the GPU's dense gradient against the CPU's for `active` levels:
  // touched rows (CPU Extract) within rounding of the atomics' order, every
  // other row of the table exactly zero.
  void ExpectGradientMatches(const std::vector<float>& gpu, uint32_t active,
                             const std::vector<float>& d_features) {
    ASSERT_EQ(gpu.size(), layout_.total_params());
    const cpu::GridBatchLookup lookup = CpuLookup(layout_, positions_, active, &pool_);
    cpu::GridGradient grad(layout_);
    grad.Accumulate(lookup, d_features.data(), &pool_);
    // The sum of |w * d| per element bounds the rounding of any order.
    std::vector<float> abs_d(d_features.size());
    std::transform(d_features.begin(), d_features.end(), abs_d.begin(),
                   [](float x) { return std::fabs(x); });
    cpu::GridGradient magnitude(layout_);
    magnitude.Accumulate(lookup, abs_d.data(), &pool_);

    std::vector<bool> touched(layout_.total_rows(), false);
    std::vector<float> got;
    std::vector<float> want;
    std::vector<float> scale;
    for (uint32_t l = 0; l < layout_.n_levels(); ++l) {
      SparseRows rows;
      grad.Extract(l, &rows);
      if (l >= active) {
        EXPECT_EQ(rows.size(), 0u) << "CPU touched switched-off level " << l;
      }
      const uint64_t offset = layout_.level(l).row_offset;
      for (size_t i = 0; i < rows.size(); ++i) {
        const uint64_t row = offset + rows.rows[i];
        touched[row] = true;
        for (uint32_t f = 0; f < F(); ++f) {
          got.push_back(gpu[row * F() + f]);
          want.push_back(rows.values[i * F() + f]);
          scale.push_back(magnitude.dense()[row * F() + f]);
        }
      }
    }
    ASSERT_FALSE(got.empty());
    ExpectAllNear(got, want, 1e-5f, "touched grad", &scale);
    size_t nonzero = 0;
    for (uint64_t row = 0; row < layout_.total_rows(); ++row) {
      if (touched[row]) continue;
      for (uint32_t f = 0; f < F(); ++f) {
        if (IsPositiveZero(gpu[row * F() + f])) continue;
        if (nonzero < 5)
          ADD_FAILURE() << "untouched row " << row << " has grad " << gpu[row * F() + f];
        ++nonzero;
      }
    }
    EXPECT_EQ(nonzero, 0u);
  }

  HashGridLayout layout_;
  std::mt19937 rng_{1234};
  ThreadPool pool_{1};
  std::vector<float> positions_;
  std::vector<float> params_;
};

TEST_P(CudaHashGridTest, ForwardMatchesCpu) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  std::vector<float> gpu;
  const Status status = cuda::host::HashGridForward(layout_, positions_, kLevels, params_, &gpu);
  ASSERT_TRUE(status.ok()) << status.ToString();

  const cpu::GridBatchLookup lookup = CpuLookup(layout_, positions_, kLevels, &pool_);
  std::vector<float> want(kSamples * Width());
  cpu::HashGridForward(layout_, lookup, params_.data(), want.data(), &pool_);
  ExpectAllNear(gpu, want, 1e-6f, "features");
}

TEST_P(CudaHashGridTest, ForwardHalfMatchesCpu) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  std::vector<uint16_t> params_half(params_.size());
  std::transform(params_.begin(), params_.end(), params_half.begin(), FloatToHalf);
  std::vector<float> gpu;
  const Status status =
      cuda::host::HashGridForwardHalf(layout_, positions_, kLevels, params_half, &gpu);
  ASSERT_TRUE(status.ok()) << status.ToString();

  const cpu::GridBatchLookup lookup = CpuLookup(layout_, positions_, kLevels, &pool_);
  std::vector<float> want(kSamples * Width());
  cpu::HashGridForward(layout_, lookup, params_half.data(), want.data(), &pool_);
  ExpectAllNear(gpu, want, 1e-6f, "fp16 features");
}

TEST_P(CudaHashGridTest, BackwardMatchesCpu) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  const std::vector<float> d_features = Uniform(kSamples * Width(), -1.0f, 1.0f, &rng_);
  std::vector<float> gpu;  // empty: sized and zeroed by the call
  const Status status =
      cuda::host::HashGridBackward(layout_, positions_, kLevels, d_features, &gpu);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ExpectGradientMatches(gpu, kLevels, d_features);

  // A second pass adds into the same buffer.
  const std::vector<float> once = gpu;
  const Status again = cuda::host::HashGridBackward(layout_, positions_, kLevels, d_features, &gpu);
  ASSERT_TRUE(again.ok()) << again.ToString();
  std::vector<float> twice(once.size());
  std::transform(once.begin(), once.end(), twice.begin(), [](float x) { return 2.0f * x; });
  ExpectAllNear(gpu, twice, 1e-5f, "grad after two passes");
}

TEST_P(CudaHashGridTest, InactiveLevelsAreZeroAndGetNoGradient) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  constexpr uint32_t kActive = 5;
  std::vector<float> gpu(kSamples * Width(), 7.0f);  // must be overwritten
  Status status = cuda::host::HashGridForward(layout_, positions_, kActive, params_, &gpu);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_EQ(gpu.size(), kSamples * Width());
  size_t nonzero = 0;
  for (size_t i = 0; i < kSamples; ++i) {
    for (uint32_t k = kActive * F(); k < Width(); ++k)
      nonzero += !IsPositiveZero(gpu[i * Width() + k]);
  }
  EXPECT_EQ(nonzero, 0u) << "switched-off levels must output zeros";
  const cpu::GridBatchLookup lookup = CpuLookup(layout_, positions_, kActive, &pool_);
  std::vector<float> want(kSamples * Width());
  cpu::HashGridForward(layout_, lookup, params_.data(), want.data(), &pool_);
  ExpectAllNear(gpu, want, 1e-6f, "features");

  const std::vector<float> d_features = Uniform(kSamples * Width(), -1.0f, 1.0f, &rng_);
  std::vector<float> grad;
  status = cuda::host::HashGridBackward(layout_, positions_, kActive, d_features, &grad);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ExpectGradientMatches(grad, kActive, d_features);  // includes: levels >= 5 all zero
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaHashGridTest,
                         testing::Values(Shape{2, 2, 16}, Shape{2, 4, 16}, Shape{3, 2, 8},
                                         Shape{3, 4, 8}),
                         ShapeName);

TEST(CudaAdamTest, SparseRowsMatchCpu) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  constexpr uint32_t kWidth = 4;
  constexpr uint32_t kRows = 200;
  constexpr uint32_t kTouchable = 150;  // rows >= 150 are never updated
  constexpr float kGradScale = 0.5f;
  const AdamHyper hyper;
  std::mt19937 rng(99);
  const std::vector<float> initial = Uniform(size_t{kRows} * kWidth, -1.0f, 1.0f, &rng);

  std::vector<float> gpu_params = initial;
  std::vector<float> gpu_m(initial.size(), 0.0f);
  std::vector<float> gpu_v(initial.size(), 0.0f);
  std::vector<uint32_t> gpu_steps(kRows, 0);
  std::vector<float> cpu_params = initial;
  cpu::AdamTable state;
  state.Resize(kRows, kWidth);

  std::bernoulli_distribution pick(0.3);
  std::vector<bool> touched(kRows, false);
  for (int step = 0; step < 4; ++step) {
    SparseRows grad;
    grad.width = kWidth;
    for (uint32_t row = 0; row < kTouchable; ++row) {
      if (row == 3 || row == 17 || pick(rng)) grad.rows.push_back(row);  // 3, 17: every step
    }
    const std::vector<float> values = Uniform(grad.rows.size() * kWidth, -2.0f, 2.0f, &rng);
    grad.values.assign(values.begin(), values.end());
    for (uint32_t row : grad.rows) touched[row] = true;

    const Status status = cuda::host::AdamUpdateRows(hyper, grad, kGradScale, &gpu_params, &gpu_m,
                                                     &gpu_v, &gpu_steps);
    ASSERT_TRUE(status.ok()) << status.ToString();
    cpu::AdamUpdateRows(hyper, grad, kGradScale, cpu_params.data(), &state);
  }

  EXPECT_EQ(gpu_steps, std::vector<uint32_t>(state.step.begin(), state.step.end()));
  EXPECT_EQ(gpu_steps[3], 4u);
  ExpectAllNear(gpu_params, cpu_params, 1e-5f, "params");
  ExpectAllNear(gpu_m, {state.m.begin(), state.m.end()}, 1e-6f, "m");
  ExpectAllNear(gpu_v, {state.v.begin(), state.v.end()}, 1e-6f, "v");
  size_t changed = 0;
  for (uint32_t row = 0; row < kRows; ++row) {
    if (touched[row]) continue;
    for (uint32_t f = 0; f < kWidth; ++f) {
      const size_t at = size_t{row} * kWidth + f;
      changed += std::bit_cast<uint32_t>(gpu_params[at]) != std::bit_cast<uint32_t>(initial[at]);
      changed += !IsPositiveZero(gpu_m[at]) + !IsPositiveZero(gpu_v[at]);
    }
    changed += gpu_steps[row] != 0;
  }
  EXPECT_EQ(changed, 0u) << "rows outside every batch must stay bit-exact";
}

// Runs everywhere: with no GPU path the API reports why through a Status.
TEST(CudaKernelsTest, FailsWithStatusWithoutDevice) {
  std::string reason;
  if (cuda::Available(&reason))
    GTEST_SKIP() << "a CUDA device is present; the kernel tests cover it";
  EXPECT_FALSE(reason.empty());
  const HashGridLayout layout = MakeLayout(Shape{2, 2, 16});
  std::mt19937 rng(5);
  const std::vector<float> positions = Positions(2, &rng);
  const std::vector<float> params(layout.total_params(), 0.5f);

  std::vector<float> features;
  const Status forward = cuda::host::HashGridForward(layout, positions, kLevels, params, &features);
  EXPECT_FALSE(forward.ok());
  EXPECT_FALSE(forward.message().empty());
  std::cout << "HashGridForward without a device: " << forward.ToString() << "\n";

  const std::vector<uint16_t> params_half(layout.total_params(), FloatToHalf(0.5f));
  EXPECT_FALSE(
      cuda::host::HashGridForwardHalf(layout, positions, kLevels, params_half, &features).ok());
  const std::vector<float> d_features(kSamples * layout.output_width(), 1.0f);
  std::vector<float> grad;
  EXPECT_FALSE(cuda::host::HashGridBackward(layout, positions, kLevels, d_features, &grad).ok());
  SparseRows rows;
  rows.width = 2;
  rows.rows = {1, 4};
  rows.values = {0.1f, 0.2f, 0.3f, 0.4f};
  std::vector<float> table(20, 0.0f), m(20, 0.0f), v(20, 0.0f);
  std::vector<uint32_t> steps(10, 0);
  EXPECT_FALSE(cuda::host::AdamUpdateRows(AdamHyper{}, rows, 1.0f, &table, &m, &v, &steps).ok());
#if defined(GRIDSYNC_HAVE_CUDA) && !GRIDSYNC_HAVE_CUDA
  EXPECT_EQ(forward.code(), StatusCode::kUnsupported);
  EXPECT_NE(forward.message().find("built without CUDA"), std::string::npos) << forward.message();
  EXPECT_NE(reason.find("built without CUDA"), std::string::npos) << reason;
#endif
}

// Runs in CUDA builds with or without a device: sizes are checked before any
// device memory is touched.
TEST(CudaKernelsTest, HostApiRejectsBadSizes) {
#if defined(GRIDSYNC_HAVE_CUDA) && !GRIDSYNC_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA: every call is kUnsupported";
#endif
  const HashGridLayout layout = MakeLayout(Shape{3, 4, 8});
  const std::vector<float> params(layout.total_params(), 0.0f);
  const std::vector<float> positions(30, 0.5f);  // 10 samples of 3 dims
  std::vector<float> out;
  auto expect_invalid = [](const Status& status, const char* what) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << what << ": " << status.ToString();
  };

  const std::vector<float> ragged(31, 0.5f);
  expect_invalid(cuda::host::HashGridForward(layout, ragged, kLevels, params, &out),
                 "ragged positions");
  const std::vector<float> short_params(params.size() - 1, 0.0f);
  expect_invalid(cuda::host::HashGridForward(layout, positions, kLevels, short_params, &out),
                 "short params");
  const std::vector<uint16_t> long_half(params.size() + 4, 0);
  expect_invalid(cuda::host::HashGridForwardHalf(layout, positions, kLevels, long_half, &out),
                 "long fp16 params");
  expect_invalid(cuda::host::HashGridForward(layout, positions, kLevels, params, nullptr),
                 "null output");
  const std::vector<float> d_short(10 * layout.output_width() - 1, 0.0f);
  expect_invalid(cuda::host::HashGridBackward(layout, positions, kLevels, d_short, &out),
                 "short d_features");
  const std::vector<float> d_features(10 * layout.output_width(), 0.0f);
  std::vector<float> bad_grad(7, 0.0f);
  expect_invalid(cuda::host::HashGridBackward(layout, positions, kLevels, d_features, &bad_grad),
                 "grad of the wrong size");

  std::vector<float> table(40, 0.0f), m(40, 0.0f), v(40, 0.0f);
  std::vector<uint32_t> steps(10, 0);
  SparseRows rows;
  rows.width = 4;
  rows.rows = {2, 5};
  rows.values.assign(7, 0.1f);
  expect_invalid(cuda::host::AdamUpdateRows(AdamHyper{}, rows, 1.0f, &table, &m, &v, &steps),
                 "values not rows x width");
  rows.values.assign(8, 0.1f);
  rows.rows = {5, 2};
  expect_invalid(cuda::host::AdamUpdateRows(AdamHyper{}, rows, 1.0f, &table, &m, &v, &steps),
                 "descending rows");
  rows.rows = {2, 2};
  expect_invalid(cuda::host::AdamUpdateRows(AdamHyper{}, rows, 1.0f, &table, &m, &v, &steps),
                 "repeated row");
  rows.rows = {2, 10};
  expect_invalid(cuda::host::AdamUpdateRows(AdamHyper{}, rows, 1.0f, &table, &m, &v, &steps),
                 "row past the table");
  rows.rows = {2, 5};
  std::vector<uint32_t> short_steps(9, 0);
  expect_invalid(cuda::host::AdamUpdateRows(AdamHyper{}, rows, 1.0f, &table, &m, &v, &short_steps),
                 "steps not one per row");
  std::vector<float> short_m(39, 0.0f);
  expect_invalid(cuda::host::AdamUpdateRows(AdamHyper{}, rows, 1.0f, &table, &short_m, &v, &steps),
                 "m not the size of params");
}

}  // namespace
}  // namespace gridsync
