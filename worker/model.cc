#include "worker/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "common/check.h"
#include "common/huge_pages.h"
#include "kernels/cpu/half.h"

namespace gridsync {
namespace {

// Samples per MLP work item. Fixed (not derived from the thread count) so
// that the order of the weight-gradient reduction, and with it every bit of
// the result, is the same for any number of threads.
constexpr size_t kMlpChunk = 2048;
// Positions per evaluation pass, which bounds the lookup scratch memory.

}  // namespace

void ModelGradients::Clear(ThreadPool* pool) {
  grid.Clear(pool);
  for (auto& m : mlp) m.setZero();
}

void ModelGradients::AddFrom(ModelGradients* other, ThreadPool* pool) {
  grid.AddFrom(&other->grid, pool);
  for (size_t i = 0; i < mlp.size(); ++i) {
    mlp[i] += other->mlp[i];
    other->mlp[i].setZero();
  }
}

Result<std::unique_ptr<HashGridModel>> HashGridModel::Create(const ModelSpec& spec) {
  GRIDSYNC_ASSIGN_OR_RETURN(HashGridLayout layout, HashGridLayout::Make(spec.grid));
  return std::unique_ptr<HashGridModel>(new HashGridModel(std::move(layout), spec));
}

HashGridModel::HashGridModel(HashGridLayout layout, const ModelSpec& spec)
    : layout_(std::move(layout)),
      mlp_shape_(spec.mlp),
      mixed_precision_(spec.mixed_precision),
      mlp_format_(spec.mlp_format),
      dynamic_resolution_(spec.dynamic_resolution_steps > 0),
      dynamic_resolution_steps_(spec.dynamic_resolution_steps) {
  std::mt19937_64 rng(spec.seed);
  std::uniform_real_distribution<float> init(-1e-4f, 1e-4f);
  // Read and written at scattered rows: on huge pages (common/huge_pages.h;
  // the vector is the model's public face, so it is advised between its
  // allocation and its first write, which then faults huge pages directly).
  grid_.reserve(layout_.total_params());
  AdviseHugePages(grid_.data(), grid_.capacity() * sizeof(float));
  grid_.resize(layout_.total_params());
  for (float& p : grid_) p = init(rng);
  mlp_ = cpu::MakeMlpWeights(mlp_shape_, Mix64Seed(spec.seed));
  if (mixed_precision_) RefreshWorkingCopyAll();
}

uint64_t HashGridModel::Mix64Seed(uint64_t seed) { return seed * 0x9E3779B97F4A7C15ull + 1; }

uint32_t HashGridModel::ActiveLevels(uint64_t step) const {
  const uint32_t levels = layout_.n_levels();
  if (!dynamic_resolution_) return levels;
  const uint32_t first = std::max<uint32_t>(1, (levels + 3) / 4);
  const double progress =
      std::min(1.0, static_cast<double>(step) / static_cast<double>(dynamic_resolution_steps_));
  return first + static_cast<uint32_t>(std::floor((levels - first) * progress));
}

void HashGridModel::RefreshWorkingCopyAll() {
  grid_half_.resize(grid_.size());
  for (size_t i = 0; i < grid_.size(); ++i) grid_half_[i] = FloatToHalf(grid_[i]);
  mlp_working_ = mlp_;
  for (auto& m : mlp_working_) {
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = RoundToHalf(m.data()[i]);
  }
}

void HashGridModel::RefreshWorkingCopy(uint32_t level, const uint32_t* rows, size_t n) {
  if (!mixed_precision_) return;
  const uint32_t F = layout_.features();
  const size_t base = layout_.level(level).row_offset * F;
  for (size_t i = 0; i < n; ++i) {
    const size_t at = base + size_t{rows[i]} * F;
    for (uint32_t f = 0; f < F; ++f) grid_half_[at + f] = FloatToHalf(grid_[at + f]);
  }
}

void HashGridModel::RefreshMlpWorkingCopy() {
  if (!mixed_precision_) return;
  for (size_t i = 0; i < mlp_.size(); ++i) {
    for (Eigen::Index k = 0; k < mlp_[i].size(); ++k)
      mlp_working_[i].data()[k] = RoundToHalf(mlp_[i].data()[k]);
  }
}

namespace {

using Clock = std::chrono::steady_clock;

// Seconds since *mark, and *mark moved to now: consecutive phases' times.
double Lap(Clock::time_point* mark) {
  const Clock::time_point now = Clock::now();
  const double seconds = std::chrono::duration<double>(now - *mark).count();
  *mark = now;
  return seconds;
}

}  // namespace

void HashGridModel::EncodeBatch(const float* positions, size_t n, uint32_t active_levels,
                                ThreadPool* pool, ComputeTimes* times) {
  Clock::time_point mark = Clock::now();
  cpu::HashGridLookup(layout_, positions, n, active_levels, &lookup_, pool);
  if (times != nullptr) times->lookup += Lap(&mark);
  features_.resize(n * layout_.output_width());
  if (mixed_precision_) {
    cpu::HashGridForward(layout_, lookup_, grid_half_.data(), features_.data(), pool);
  } else {
    cpu::HashGridForward(layout_, lookup_, grid_.data(), features_.data(), pool);
  }
  if (times != nullptr) times->grid_forward += Lap(&mark);
}

double HashGridModel::AccumulateGradients(const float* positions, const float* targets, size_t n,
                                          size_t global_batch, float loss_scale,
                                          uint32_t active_levels, ModelGradients* grads,
                                          ThreadPool* pool) {
  EncodeBatch(positions, n, active_levels, pool, &compute_times_);
  Clock::time_point mark = Clock::now();
  const int in_width = mlp_shape_.input_width;
  const int out_width = mlp_shape_.output_width;
  d_features_.resize(features_.size());
  const cpu::MlpWeights& weights = mixed_precision_ ? mlp_working_ : mlp_;

  const size_t chunks = (n + kMlpChunk - 1) / kMlpChunk;
  if (chunk_results_.size() < chunks) chunk_results_.resize(chunks);
  mlp_scratch_.resize(static_cast<size_t>(pool->size()));
  // d(mean squared error)/dy, with the loss scale folded in.
  const float dy_scale = 2.0f * loss_scale / static_cast<float>(global_batch * out_width);
  pool->ParallelForSlots(chunks, [&](size_t c, int slot) {
    MlpScratch& scratch = mlp_scratch_[static_cast<size_t>(slot)];
    ChunkResult& result = chunk_results_[c];
    const size_t begin = c * kMlpChunk;
    const auto cols = static_cast<Eigen::Index>(std::min(kMlpChunk, n - begin));
    cpu::ConstMatrixMap x(features_.data() + begin * in_width, in_width, cols);
    cpu::MlpForward(mlp_shape_, weights, x, &scratch.workspace, &scratch.y, mlp_format_);
    const cpu::ConstMatrixMap t(targets + begin * out_width, out_width, cols);
    scratch.dy = scratch.y - t;
    // Each square summed in double, as the device twin does (trainer_kernels.cu's
    // SquaredErrorKernel): a float sum of a chunk's 6144 squares would round
    // the reported loss differently on the two paths.
    result.sse = scratch.dy.cast<double>().squaredNorm();
    scratch.dy *= dy_scale;
    if (result.dw.size() != mlp_.size()) result.dw = cpu::ZeroMlpWeights(mlp_shape_);
    for (auto& m : result.dw) m.setZero();
    cpu::MatrixMap dx(d_features_.data() + begin * in_width, in_width, cols);
    cpu::MlpBackward(mlp_shape_, weights, x, &scratch.workspace, scratch.dy, &result.dw, &dx,
                     mlp_format_);
  });
  double sse = 0;
  for (size_t c = 0; c < chunks; ++c) {
    sse += chunk_results_[c].sse;
    for (size_t i = 0; i < grads->mlp.size(); ++i) grads->mlp[i] += chunk_results_[c].dw[i];
  }
  compute_times_.mlp += Lap(&mark);
  if (grads->compact_grid) {
    grads->grid.AccumulateCompact(lookup_, d_features_.data(), pool);
  } else {
    grads->grid.Accumulate(lookup_, d_features_.data(), pool);
  }
  compute_times_.grid_backward += Lap(&mark);
  return sse;
}

void HashGridModel::Predict(const float* positions, size_t n, uint32_t active_levels, float* out,
                            ThreadPool* pool) {
  const int in_width = mlp_shape_.input_width;
  const int out_width = mlp_shape_.output_width;
  const uint32_t dims = layout_.spec().dims;
  const cpu::MlpWeights& weights = mixed_precision_ ? mlp_working_ : mlp_;
  for (size_t begin = 0; begin < n; begin += kPredictChunk) {
    const size_t count = std::min(kPredictChunk, n - begin);
    EncodeBatch(positions + begin * dims, count, active_levels, pool);
    const size_t chunks = (count + kMlpChunk - 1) / kMlpChunk;
    mlp_scratch_.resize(static_cast<size_t>(pool->size()));
    pool->ParallelForSlots(chunks, [&](size_t c, int slot) {
      MlpScratch& scratch = mlp_scratch_[static_cast<size_t>(slot)];
      const size_t at = c * kMlpChunk;
      const auto cols = static_cast<Eigen::Index>(std::min(kMlpChunk, count - at));
      cpu::ConstMatrixMap x(features_.data() + at * in_width, in_width, cols);
      cpu::MlpForward(mlp_shape_, weights, x, &scratch.workspace, &scratch.y, mlp_format_);
      std::copy_n(scratch.y.data(), cols * out_width, out + (begin + at) * out_width);
    });
  }
}

}  // namespace gridsync
