#include "worker/host_trainer.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "common/row_width.h"
#include "kernels/cpu/adam_batch.h"
#include "worker/sync/gradient_sync.h"
#include "worker/worker_adam.h"

namespace gridsync {

HostTrainer::HostTrainer(std::unique_ptr<HashGridModel> model, const AdamHyper& hyper,
                         ThreadPool* pool)
    : model_(std::move(model)),
      grads_(model_->layout(), model_->mlp_shape()),
      optimizer_(model_.get(), hyper),
      pool_(pool),
      hyper_(hyper),
      worker_adam_(model_->layout().n_levels()) {}

Result<std::unique_ptr<HostTrainer>> HostTrainer::Create(const RunSpec& spec,
                                                         const HashGridModel& model,
                                                         ThreadPool* pool, bool as_if_on_device) {
  GRIDSYNC_ASSIGN_OR_RETURN(std::unique_ptr<HashGridModel> copy, HashGridModel::Create(spec.model));
  copy->grid_params() = model.grid_params();
  copy->mlp_weights() = model.mlp_weights();
  copy->RefreshWorkingCopyAll();
  std::unique_ptr<HostTrainer> trainer(new HostTrainer(std::move(copy), spec.model.adam, pool));
  trainer->as_if_on_device_ = as_if_on_device;
  trainer->CutBuckets(SIZE_MAX);  // the whole grid in one bucket, as the device does
  return trainer;
}

Result<double> HostTrainer::ComputeGradients(const float* positions, const float* targets, size_t n,
                                             size_t global_batch, uint32_t active_levels,
                                             float loss_scale) {
  return model_->AccumulateGradients(positions, targets, n, global_batch, loss_scale, active_levels,
                                     &grads_, pool_);
}

Result<bool> HostTrainer::RoundGradientsToHalf() {
  bool fits = true;
  for (const auto& buffer : GradientBuffers())
    fits = RoundToHalfChecked(buffer.data(), buffer.size()) && fits;
  return fits;
}

std::vector<std::span<float>> HostTrainer::GradientBuffers() {
  std::vector<std::span<float>> buffers = {grads_.grid.dense_span()};
  for (auto& m : grads_.mlp) buffers.emplace_back(m.data(), static_cast<size_t>(m.size()));
  return buffers;
}

std::vector<std::vector<std::span<float>>> HostTrainer::CutBuckets(size_t bucket_bytes) {
  std::vector<std::pair<uint32_t, uint32_t>> groups;
  buckets_ = cuda::CutGradientBuckets(model_->layout(), GradientBuffers(), bucket_bytes, &groups);
  return buckets_;
}

Status HostTrainer::BeginGradients(const float* positions, const float* targets, size_t n,
                                   size_t global_batch, uint32_t active_levels, float loss_scale,
                                   bool round_to_half) {
  finished_ = {};
  GRIDSYNC_ASSIGN_OR_RETURN(finished_.sse, ComputeGradients(positions, targets, n, global_batch,
                                                            active_levels, loss_scale));
  if (round_to_half) {
    GRIDSYNC_ASSIGN_OR_RETURN(finished_.fits, RoundGradientsToHalf());
  }
  return Status::OK();
}

Status HostTrainer::CopyBucket(size_t b, const std::vector<std::span<float>>& host,
                               bool to_device) {
  if (b >= buckets_.size()) {
    return Status::InvalidArgument("HostTrainer::CopyBucket: bucket " + std::to_string(b) + " of " +
                                   std::to_string(buckets_.size()));
  }
  GRIDSYNC_RETURN_IF_ERROR(cuda::CheckBufferShapes(host, buckets_[b], "HostTrainer::CopyBucket"));
  for (size_t i = 0; i < host.size(); ++i) {
    if (to_device) {
      std::copy(host[i].begin(), host[i].end(), buckets_[b][i].begin());
    } else {
      std::copy(buckets_[b][i].begin(), buckets_[b][i].end(), host[i].begin());
    }
  }
  return Status::OK();
}

Status HostTrainer::ApplyGradients(float loss_scale) {
  optimizer_.ApplyDense(grads_.grid.mutable_dense(), &grads_.mlp, 1.0f / loss_scale, pool_);
  grads_.grid.ForgetTouched();
  return Status::OK();
}

Status HostTrainer::ClearGradients() {
  auto grid = grads_.grid.dense_span();
  std::fill(grid.begin(), grid.end(), 0.0f);
  grads_.grid.ForgetTouched();
  for (auto& m : grads_.mlp) m.setZero();
  return Status::OK();
}

Status HostTrainer::EncodeBlock(const CodecOptions& options, const float* values, size_t n,
                                uint64_t seed, uint8_t* payload, float* decoded) {
  cpu::Encode(options, values, n, seed, payload);
  if (decoded == nullptr) return Status::OK();
  return cpu::Decode(options, payload, EncodedSize(options, n), n, seed, decoded);
}

Result<bool> HostTrainer::PrepareGridPush(const uint32_t* rows, size_t n, bool round_to_half,
                                          float scale) {
  GRIDSYNC_RETURN_IF_ERROR(CheckRows(rows, n));
  const uint32_t F = model_->layout().features();
  float* grad = grads_.grid.mutable_dense();
  bool fits = true;
  for (size_t i = 0; i < n; ++i) {
    float* row = grad + size_t{rows[i]} * F;
    if (round_to_half) fits = RoundToHalfChecked(row, F) && fits;
    if (scale != 1.0f) {
      for (uint32_t f = 0; f < F; ++f) row[f] *= scale;
    }
  }
  return fits;
}

Status HostTrainer::FetchPushBlock(const PushBlock& block, float* values) {
  const auto& layout = model_->layout();
  GRIDSYNC_RETURN_IF_ERROR(cuda::CheckPushBlock(layout, block));
  const uint32_t F = layout.features();
  const float* grad = grads_.grid.dense() + layout.level(block.level).row_offset * F;
  for (size_t i = 0; i < block.n; ++i) {
    const float* row = grad + size_t{block.rows[i]} * F + block.col_begin;
    std::copy(row, row + block.width, values + i * block.width);
  }
  return Status::OK();
}

Status HostTrainer::EncodePushBlock(const PushBlock& block, const CodecOptions& options,
                                    uint64_t seed, bool feedback, bool mask_momentum,
                                    uint8_t* payload) {
  std::lock_guard<std::mutex> lock(push_mu_);
  const size_t count = block.n * block.width;
  std::vector<float> values(count);
  GRIDSYNC_RETURN_IF_ERROR(FetchPushBlock(block, values.data()));
  const uint64_t key = PushBlockKey(block.level, block.col_begin);
  if (feedback) residuals_.AddResidual(key, block.rows, block.n, block.width, values.data());
  cpu::Encode(options, values.data(), count, seed, payload);
  if (!feedback) return Status::OK();
  std::vector<float> decoded(count);
  GRIDSYNC_RETURN_IF_ERROR(
      cpu::Decode(options, payload, EncodedSize(options, count), count, seed, decoded.data()));
  residuals_.StoreResidual(key, block.rows, block.n, block.width, values.data(), decoded.data());
  if (mask_momentum) {
    MaskMomentumRows(WorkerAdamOf(block.level).m.data(), model_->layout().features(), block.rows,
                     block.n, block.col_begin, block.width, decoded.data());
  }
  return Status::OK();
}

cpu::AdamTable& HostTrainer::WorkerAdamOf(uint32_t level) {
  cpu::AdamTable& state = worker_adam_[level];
  if (state.step.empty())
    state.Resize(model_->layout().level(level).rows, model_->layout().features());
  return state;
}

Status HostTrainer::GridWorkerAdam(uint32_t level, const uint32_t* rows, size_t n,
                                   std::vector<uint32_t>* kept) {
  const auto& layout = model_->layout();
  const uint32_t F = layout.features();
  GRIDSYNC_RETURN_IF_ERROR(cuda::CheckPushBlock(layout, {level, 0, F, rows, n}));
  std::lock_guard<std::mutex> lock(push_mu_);
  cpu::AdamTable& state = WorkerAdamOf(level);
  float* grad = grads_.grid.mutable_dense() + layout.level(level).row_offset * F;
  kept->clear();
  // The update replaces the gradient in place: the batch takes a copy of
  // each row's gradient when it queues the row.
  WithRowWidth(F, [&](auto constant) {
    constexpr uint32_t W = decltype(constant)::value;
    cpu::AdamRowBatch<(W > 0 ? W : 1), cpu::AdamBatchOut::kNegatedStep> batch(
        hyper_, grad, state.m.data(), state.v.data());
    for (size_t i = 0; i < n; ++i) {
      const uint32_t row = rows[i];
      float* g = grad + size_t{row} * F;
      if (!RowHasGradient(g, F)) continue;
      const float lr = state.StepSize(hyper_, ++state.step[row]);
      if constexpr (W > 0) {
        batch.Add(g, 1.0f, lr, row, size_t{row} * W);
      } else {
        for (uint32_t f = 0; f < F; ++f) {
          const size_t at = size_t{row} * F + f;
          g[f] = -AdamStep(hyper_, lr, g[f], &state.m[at], &state.v[at]);
        }
      }
      kept->push_back(row);
    }
    if constexpr (W > 0) batch.Flush();
  });
  return Status::OK();
}

Status HostTrainer::AddResidualsToGridRows(const uint32_t* rows, size_t n) {
  GRIDSYNC_RETURN_IF_ERROR(CheckRows(rows, n));
  std::lock_guard<std::mutex> lock(push_mu_);
  const auto& layout = model_->layout();
  const uint32_t F = layout.features();
  float* grid = model_->grid_params().data();
  for (size_t i = 0; i < n; ++i) {
    const auto [level, local] = Locate(rows[i]);
    for (uint32_t col = 0; col < F; ++col) {
      const float* residual = residuals_.Residual(PushBlockKey(level, col), local);
      if (residual == nullptr) continue;
      const uint32_t width = residuals_.Width(PushBlockKey(level, col));
      float* p = grid + size_t{rows[i]} * F + col;
      for (uint32_t f = 0; f < width; ++f) p[f] += residual[f];
    }
    model_->RefreshWorkingCopy(level, &local, 1);
  }
  return Status::OK();
}

Status HostTrainer::CopyGridAdamState(uint32_t level, float* m, float* v, uint32_t* steps) {
  if (level >= worker_adam_.size())
    return Status::InvalidArgument("HostTrainer: no level " + std::to_string(level));
  std::lock_guard<std::mutex> lock(push_mu_);
  const cpu::AdamTable& state = WorkerAdamOf(level);
  std::copy(state.m.begin(), state.m.end(), m);
  std::copy(state.v.begin(), state.v.end(), v);
  std::copy(state.step.begin(), state.step.end(), steps);
  return Status::OK();
}

Status HostTrainer::LoadGridAdamState(uint32_t level, const float* m, const float* v,
                                      const uint32_t* steps) {
  if (level >= worker_adam_.size())
    return Status::InvalidArgument("HostTrainer: no level " + std::to_string(level));
  std::lock_guard<std::mutex> lock(push_mu_);
  cpu::AdamTable& state = WorkerAdamOf(level);
  const size_t values = state.m.size(), rows = state.step.size();
  if (m == nullptr) {
    std::fill_n(state.m.begin(), values, 0.0f);
    std::fill_n(state.v.begin(), values, 0.0f);
    std::fill_n(state.step.begin(), rows, 0u);
    return Status::OK();
  }
  std::copy_n(m, values, state.m.begin());
  std::copy_n(v, values, state.v.begin());
  std::copy_n(steps, rows, state.step.begin());
  return Status::OK();
}

Status HostTrainer::ZeroGridGradientRows(const uint32_t* rows, size_t n) {
  GRIDSYNC_RETURN_IF_ERROR(CheckRows(rows, n));
  const uint32_t F = model_->layout().features();
  float* grad = grads_.grid.mutable_dense();
  for (size_t i = 0; i < n; ++i) std::fill_n(grad + size_t{rows[i]} * F, F, 0.0f);
  return Status::OK();
}

namespace {
// dst = src, key for key and entry for entry (through the checkpoint bytes).
Status CopyFeedback(const cpu::ErrorFeedback& src, cpu::ErrorFeedback* dst) {
  std::string bytes;
  src.AppendState(&bytes);
  std::string_view in = bytes;
  return dst->RestoreState(&in);
}
}  // namespace

Status HostTrainer::CopyResidualsTo(cpu::ErrorFeedback* into) {
  std::lock_guard<std::mutex> lock(push_mu_);
  return CopyFeedback(residuals_, into);
}

Status HostTrainer::LoadResiduals(const cpu::ErrorFeedback& from) {
  std::lock_guard<std::mutex> lock(push_mu_);
  GRIDSYNC_RETURN_IF_ERROR(cuda::CheckResiduals(model_->layout(), from));
  return CopyFeedback(from, &residuals_);
}

std::pair<uint32_t, uint32_t> HostTrainer::Locate(uint32_t row) const {
  const auto& layout = model_->layout();
  uint32_t level = 0;
  while (level + 1 < layout.n_levels() && row >= layout.level(level + 1).row_offset) ++level;
  return {level, static_cast<uint32_t>(row - layout.level(level).row_offset)};
}

Status HostTrainer::CheckRows(const uint32_t* rows, size_t n) const {
  const uint64_t total = model_->layout().total_rows();
  for (size_t i = 0; i < n; ++i) {
    if (rows[i] >= total) {
      return Status::InvalidArgument("HostTrainer: grid row " + std::to_string(rows[i]) +
                                     "; allowed: below " + std::to_string(total));
    }
  }
  return Status::OK();
}

Status HostTrainer::UploadGridRows(const uint32_t* rows, size_t n, const float* values) {
  GRIDSYNC_RETURN_IF_ERROR(CheckRows(rows, n));
  const uint32_t F = model_->layout().features();
  float* grid = model_->grid_params().data();
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(grid + size_t{rows[i]} * F, values + i * F, F * sizeof(float));
    const auto [level, local] = Locate(rows[i]);
    model_->RefreshWorkingCopy(level, &local, 1);
  }
  return Status::OK();
}

Status HostTrainer::TakeGridGradientRows(const uint32_t* rows, size_t n, float* values) {
  GRIDSYNC_RETURN_IF_ERROR(CheckRows(rows, n));
  const uint32_t F = model_->layout().features();
  float* grad = grads_.grid.mutable_dense();
  for (size_t i = 0; i < n; ++i) {
    float* row = grad + size_t{rows[i]} * F;
    std::memcpy(values + i * F, row, F * sizeof(float));
    std::fill(row, row + F, 0.0f);
  }
  return Status::OK();
}

Status HostTrainer::UploadMlp(const std::vector<std::span<const float>>& weights) {
  auto& mlp = model_->mlp_weights();
  if (weights.size() != mlp.size())
    return Status::InvalidArgument("HostTrainer: " + std::to_string(weights.size()) +
                                   " MLP matrices; the model has " + std::to_string(mlp.size()));
  for (size_t i = 0; i < mlp.size(); ++i) {
    if (weights[i].size() != static_cast<size_t>(mlp[i].size()))
      return Status::InvalidArgument("HostTrainer: MLP matrix " + std::to_string(i) +
                                     " has another size than the model's");
    std::memcpy(mlp[i].data(), weights[i].data(), weights[i].size_bytes());
  }
  model_->RefreshMlpWorkingCopy();
  return Status::OK();
}

Status HostTrainer::TakeMlpGradients(const std::vector<std::span<float>>& grads) {
  if (grads.size() != grads_.mlp.size())
    return Status::InvalidArgument("HostTrainer: " + std::to_string(grads.size()) +
                                   " MLP gradients; the model has " +
                                   std::to_string(grads_.mlp.size()));
  for (size_t i = 0; i < grads.size(); ++i) {
    auto& m = grads_.mlp[i];
    if (grads[i].size() != static_cast<size_t>(m.size()))
      return Status::InvalidArgument("HostTrainer: MLP gradient " + std::to_string(i) +
                                     " has another size than the model's");
    std::memcpy(grads[i].data(), m.data(), grads[i].size_bytes());
    m.setZero();
  }
  return Status::OK();
}

Status HostTrainer::Predict(const float* positions, size_t n, uint32_t active_levels, float* out) {
  model_->Predict(positions, n, active_levels, out, pool_);
  return Status::OK();
}

Status HostTrainer::Download(std::vector<float>* grid, std::vector<std::vector<float>>* mlp) {
  *grid = model_->grid_params();
  mlp->clear();
  for (const auto& m : model_->mlp_weights()) mlp->emplace_back(m.data(), m.data() + m.size());
  return Status::OK();
}

Result<cuda::DeviceTrainer::NodeExchange> HostTrainer::PackNodeGradients(const uint32_t* rows,
                                                                         size_t n,
                                                                         size_t slice_floats,
                                                                         bool round_to_half, bool) {
  GRIDSYNC_RETURN_IF_ERROR(CheckRows(rows, n));
  const uint32_t F = model_->layout().features();
  size_t mlp_floats = 0;
  for (const auto& m : grads_.mlp) mlp_floats += static_cast<size_t>(m.size());
  node_packed_.resize(n * F + mlp_floats);
  node_slice_.resize(slice_floats);
  float* grad = grads_.grid.mutable_dense();
  float* out = node_packed_.data();
  for (size_t i = 0; i < n; ++i, out += F) {
    float* row = grad + size_t{rows[i]} * F;
    std::memcpy(out, row, F * sizeof(float));
    std::fill_n(row, F, 0.0f);
  }
  for (auto& m : grads_.mlp) {
    std::memcpy(out, m.data(), static_cast<size_t>(m.size()) * sizeof(float));
    out += m.size();
    m.setZero();
  }
  NodeExchange exchange{node_packed_.data(), node_packed_.size(), node_slice_.data(), true};
  if (round_to_half) exchange.fits = RoundToHalfChecked(node_packed_.data(), node_packed_.size());
  return exchange;
}

Status HostTrainer::UnpackNodeSlice(const uint32_t* rows, size_t n, float* mlp_values,
                                    size_t mlp_floats) {
  GRIDSYNC_RETURN_IF_ERROR(CheckRows(rows, n));
  const uint32_t F = model_->layout().features();
  if (n * F + mlp_floats != node_slice_.size()) {
    return Status::InvalidArgument("HostTrainer::UnpackNodeSlice: " + std::to_string(n) +
                                   " rows and " + std::to_string(mlp_floats) +
                                   " MLP floats; the slice holds " +
                                   std::to_string(node_slice_.size()) + " floats");
  }
  float* grad = grads_.grid.mutable_dense();
  for (size_t i = 0; i < n; ++i)
    std::memcpy(grad + size_t{rows[i]} * F, node_slice_.data() + i * F, F * sizeof(float));
  if (mlp_floats > 0)  // only the last slices hold MLP rows
    std::memcpy(mlp_values, node_slice_.data() + n * F, mlp_floats * sizeof(float));
  return Status::OK();
}

Status HostTrainer::GridRowsWithGradient(const uint32_t* rows, size_t n, uint8_t* has) {
  GRIDSYNC_RETURN_IF_ERROR(CheckRows(rows, n));
  const uint32_t F = model_->layout().features();
  const float* grad = grads_.grid.dense();
  for (size_t i = 0; i < n; ++i) has[i] = RowHasGradient(grad + size_t{rows[i]} * F, F) ? 1 : 0;
  return Status::OK();
}

Status HostTrainer::DownloadGridRows(const uint32_t* rows, size_t n, float* values) {
  GRIDSYNC_RETURN_IF_ERROR(CheckRows(rows, n));
  const uint32_t F = model_->layout().features();
  const float* grid = model_->grid_params().data();
  for (size_t i = 0; i < n; ++i)
    std::memcpy(values + i * F, grid + size_t{rows[i]} * F, F * sizeof(float));
  return Status::OK();
}

}  // namespace gridsync
