#include "worker/local_optimizer.h"

#include <algorithm>

namespace gridsync {
namespace {

// Levels by falling size: the finest levels hold most of a step's touched
// rows, and a thread pool that hands them out first ends with the small
// ones instead of waiting on one large level taken last (levels are
// independent, so the order changes no result).
uint32_t CostliestFirst(const HashGridLayout& layout, size_t i) {
  return layout.n_levels() - 1 - static_cast<uint32_t>(i);
}

// Rows per slice: a multiple of 64 (GridGradient::TakeRowIds takes whole
// bitmap words). A full 2^19-row level makes 4 slices.
constexpr uint64_t kRowsPerSlice = uint64_t{1} << 17;

}  // namespace

LocalOptimizer::LocalOptimizer(HashGridModel* model, const AdamHyper& hyper)
    : model_(model), hyper_(hyper) {
  const auto& layout = model->layout();
  grid_state_.resize(layout.n_levels());
  for (uint32_t l = 0; l < layout.n_levels(); ++l)
    grid_state_[l].Resize(layout.level(l).rows, layout.features());
  const auto& shape = model->mlp_shape();
  mlp_state_.resize(static_cast<size_t>(shape.n_matrices()));
  // Column-major weights: a table row is one column of the matrix.
  for (int i = 0; i < shape.n_matrices(); ++i)
    mlp_state_[static_cast<size_t>(i)].Resize(shape.cols(i), shape.rows(i));
  for (uint32_t i = 0; i < layout.n_levels(); ++i) {
    const uint32_t level = CostliestFirst(layout, i);
    const uint64_t rows = layout.level(level).rows;
    for (uint64_t begin = 0; begin < rows; begin += kRowsPerSlice)
      slices_.push_back({level, begin, std::min(rows, begin + kRowsPerSlice)});
  }
  rows_.resize(slices_.size());
}

void LocalOptimizer::BeginApply() {
  ++applies_;
  for (auto& state : grid_state_) state.ReserveSteps(hyper_, applies_);
}

void LocalOptimizer::ApplyMlp(cpu::MlpWeights* mlp, float grad_scale) {
  auto& weights = model_->mlp_weights();
  for (size_t i = 0; i < weights.size(); ++i) {
    cpu::AdamUpdateDense(hyper_, (*mlp)[i].data(), static_cast<uint64_t>(weights[i].cols()),
                         grad_scale, weights[i].data(), &mlp_state_[i]);
    (*mlp)[i].setZero();
  }
  model_->RefreshMlpWorkingCopy();
}

uint64_t LocalOptimizer::ApplyRows(const std::vector<SparseRows>& rows, cpu::MlpWeights* mlp,
                                   float grad_scale, ThreadPool* pool) {
  const auto& layout = model_->layout();
  float* grid = model_->grid_params().data();
  BeginApply();
  pool->ParallelFor(layout.n_levels(), [&](size_t i) {
    const uint32_t level = CostliestFirst(layout, i);
    float* table = grid + layout.level(level).row_offset * layout.features();
    cpu::AdamUpdateRows(hyper_, rows[level], grad_scale, table, &grid_state_[level]);
    model_->RefreshWorkingCopy(level, rows[level].rows.data(), rows[level].rows.size());
  });
  ApplyMlp(mlp, grad_scale);
  uint64_t updated = 0;
  for (const auto& r : rows) updated += r.size();
  return updated;
}

uint64_t LocalOptimizer::ApplyTouched(ModelGradients* grads, ThreadPool* pool) {
  const auto& layout = model_->layout();
  const uint32_t F = layout.features();
  float* grid = model_->grid_params().data();
  const bool compact = grads->grid.compact();
  float* grad = compact ? nullptr : grads->grid.mutable_dense();
  BeginApply();
  pool->ParallelFor(slices_.size(), [&](size_t i) {
    const Slice& slice = slices_[i];
    const size_t offset = layout.level(slice.level).row_offset * F;
    auto& rows = rows_[i];
    grads->grid.TakeRowIds(slice.level, slice.begin, slice.end, &rows);
    if (compact) {
      cpu::AdamUpdateRows(hyper_, rows.data(), rows.size(),
                          grads->grid.CompactValues(slice.level, slice.begin), 1.0f, grid + offset,
                          &grid_state_[slice.level]);
    } else {
      cpu::AdamUpdateIndexed(hyper_, rows.data(), rows.size(), grad + offset, grid + offset,
                             &grid_state_[slice.level]);
    }
    model_->RefreshWorkingCopy(slice.level, rows.data(), rows.size());
  });
  ApplyMlp(&grads->mlp, 1.0f);
  if (compact) grads->grid.Clear(pool);  // its rows are taken: this forgets the compact form
  uint64_t updated = 0;
  for (const auto& r : rows_) updated += r.size();
  return updated;
}

uint64_t LocalOptimizer::ApplyDense(float* grid_grad, cpu::MlpWeights* mlp, float grad_scale,
                                    ThreadPool* pool) {
  const auto& layout = model_->layout();
  const uint32_t F = layout.features();
  float* grid = model_->grid_params().data();
  BeginApply();
  pool->ParallelFor(slices_.size(), [&](size_t i) {
    const Slice& slice = slices_[i];
    const uint32_t level = slice.level;
    const auto& info = layout.level(level);
    float* g = grid_grad + info.row_offset * F;
    auto& rows = rows_[i];
    rows.clear();
    for (auto r = static_cast<uint32_t>(slice.begin); r < slice.end; ++r) {
      float* row = g + size_t{r} * F;
      if (!RowHasGradient(row, F)) continue;
      rows.push_back(r);
      // The same product AdamUpdateRows forms from grad_scale.
      if (grad_scale != 1.0f) {
        for (uint32_t f = 0; f < F; ++f) row[f] *= grad_scale;
      }
    }
    cpu::AdamUpdateIndexed(hyper_, rows.data(), rows.size(), g, grid + info.row_offset * F,
                           &grid_state_[level]);
    model_->RefreshWorkingCopy(level, rows.data(), rows.size());
  });
  ApplyMlp(mlp, grad_scale);
  uint64_t updated = 0;
  for (const auto& r : rows_) updated += r.size();
  return updated;
}

void LocalOptimizer::AppendState(std::string* out) const {
  for (const auto& state : grid_state_) cpu::AppendAdamTable(state, out);
  for (const auto& state : mlp_state_) cpu::AppendAdamTable(state, out);
}

Status LocalOptimizer::RestoreState(std::string_view* in, uint64_t step) {
  for (size_t l = 0; l < grid_state_.size(); ++l) {
    GRIDSYNC_RETURN_IF_ERROR(cpu::TakeAdamTable(
        in, step, "Adam state of grid level " + std::to_string(l), &grid_state_[l]));
  }
  for (size_t i = 0; i < mlp_state_.size(); ++i) {
    GRIDSYNC_RETURN_IF_ERROR(cpu::TakeAdamTable(
        in, step, "Adam state of MLP matrix " + std::to_string(i), &mlp_state_[i]));
  }
  // No count exceeds `step` (checked), so `step` bounds the next apply's
  // counts as the calls did (BeginApply reserves the step sizes from it).
  applies_ = static_cast<uint32_t>(std::min<uint64_t>(step, UINT32_MAX - 1));
  return Status::OK();
}

uint64_t LocalOptimizer::StateBytes() const {
  uint64_t bytes = 0;
  for (const auto& state : grid_state_) bytes += cpu::AdamTableBytes(state);
  for (const auto& state : mlp_state_) bytes += cpu::AdamTableBytes(state);
  return bytes;
}

}  // namespace gridsync
