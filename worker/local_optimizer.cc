#include "worker/local_optimizer.h"

#include <atomic>
#include <cmath>

#include "kernels/cpu/half.h"
#include "kernels/model_tables.h"

namespace gridsync {
namespace {

// A gradient that fp16 cannot hold means the loss scale is too high.
inline bool FitsHalf(float g) { return std::isfinite(g) && std::fabs(g) <= kHalfMax; }

}  // namespace

LocalOptimizer::LocalOptimizer(HashGridModel* model, const Config& config)
    : model_(model),
      hyper_(AdamHyperFromConfig(config.training)),
      scaler_(config.training.mixed_precision) {
  const auto& layout = model->layout();
  grid_state_.resize(layout.n_levels());
  for (uint32_t l = 0; l < layout.n_levels(); ++l)
    grid_state_[l].Resize(layout.level(l).rows, layout.features());
  const auto& shape = model->mlp_shape();
  mlp_state_.resize(shape.n_matrices());
  // Column-major weights: a table row is one column of the matrix.
  for (int i = 0; i < shape.n_matrices(); ++i) mlp_state_[i].Resize(shape.cols(i), shape.rows(i));
  touched_.resize(layout.n_levels());
}

LocalOptimizer::StepStats LocalOptimizer::Step(ModelGradients* grads, ThreadPool* pool) {
  const auto& layout = model_->layout();
  const uint32_t levels = layout.n_levels();
  const bool mixed = scaler_.enabled();
  StepStats stats;
  stats.loss_scale = scaler_.scale();

  std::atomic<bool> finite{true};
  pool->ParallelFor(levels, [&](size_t l) {
    SparseRows& rows = touched_[l];
    rows.clear();
    grads->grid.Take(static_cast<uint32_t>(l), &rows);
    if (!mixed) return;
    // Gradients travel as fp16 at the loss scale: round them, and detect
    // overflow exactly where an fp16 pipeline would produce inf.
    for (float& g : rows.values) {
      if (!FitsHalf(g)) finite = false;
      g = RoundToHalf(g);
    }
  });
  if (mixed) {
    for (auto& m : grads->mlp) {
      for (Eigen::Index i = 0; i < m.size(); ++i) {
        float& g = m.data()[i];
        if (!FitsHalf(g)) finite = false;
        g = RoundToHalf(g);
      }
    }
  }
  if (!scaler_.Update(finite.load())) {
    for (auto& m : grads->mlp) m.setZero();  // the grid's were taken above
    return stats;
  }

  const float grad_scale = 1.0f / stats.loss_scale;
  float* grid = model_->grid_params().data();
  pool->ParallelFor(levels, [&](size_t l) {
    float* table = grid + layout.level(static_cast<uint32_t>(l)).row_offset * layout.features();
    cpu::AdamUpdateRows(hyper_, touched_[l], grad_scale, table, &grid_state_[l]);
  });
  auto& weights = model_->mlp_weights();
  for (size_t i = 0; i < weights.size(); ++i) {
    cpu::AdamUpdateDense(hyper_, grads->mlp[i].data(), static_cast<uint64_t>(weights[i].cols()),
                         grad_scale, weights[i].data(), &mlp_state_[i]);
  }
  model_->RefreshWorkingCopy(touched_);
  for (const auto& rows : touched_) stats.grid_rows += rows.size();
  stats.applied = true;
  for (auto& m : grads->mlp) m.setZero();
  return stats;
}

}  // namespace gridsync
