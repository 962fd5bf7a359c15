#include "worker/sync/device_staged_sync.h"

#include <cstring>
#include <string>
#include <utility>

#include "worker/ps_client.h"
#include "worker/sync/device_sync.h"

namespace gridsync {

DeviceStagedSync::DeviceStagedSync(const RunSpec& spec, HashGridModel* model,
                                   std::unique_ptr<GradientSync> host,
                                   std::unique_ptr<cuda::DeviceTrainer> trainer, ThreadPool* pool)
    : config_(spec.config),
      model_(model),
      host_(std::move(host)),
      trainer_(std::move(trainer)),
      pool_(pool),
      row_set_(model->layout()),
      grads_(model->layout(), model->mlp_shape()) {
  rank_ = host_->rank();
  me_ = host_->me() + " (" + trainer_->device_name() + ")";
  // The pushes' codecs run on the model's device.
  if (PsClient* ps = host_->ps_client();
      ps != nullptr && spec.compression.codec.codec != Codec::kNone) {
    cuda::DeviceTrainer* trainer = trainer_.get();
    ps->SetBlockEncoder([trainer](const CodecOptions& options, const float* values, size_t n,
                                  uint64_t seed, uint8_t* payload, float* decoded) {
      return trainer->EncodeBlock(options, values, n, seed, payload, decoded);
    });
  }
}

DeviceStagedSync::~DeviceStagedSync() {
  // The client outlives the trainer its encoder calls.
  if (PsClient* ps = host_->ps_client(); ps != nullptr) ps->SetBlockEncoder(nullptr);
}

Result<const StepBatch*> DeviceStagedSync::Prepare(uint64_t step) {
  GRIDSYNC_ASSIGN_OR_RETURN(const StepBatch* batch, host_->Prepare(step));
  step_ = step;
  const auto& layout = model_->layout();
  const uint32_t F = layout.features();
  cpu::HashGridLookup(layout, batch->positions.data(), batch->count, model_->ActiveLevels(step),
                      &lookup_, pool_);
  row_set_.Assign(lookup_, pool_);
  rows_.clear();
  level_begin_.assign(1, 0);
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    const uint64_t offset = layout.level(l).row_offset;
    for (uint32_t r : row_set_.rows(l)) rows_.push_back(static_cast<uint32_t>(offset + r));
    level_begin_.push_back(rows_.size());
  }
  values_.resize(rows_.size() * F);
  const float* grid = model_->grid_params().data();
  for (size_t i = 0; i < rows_.size(); ++i)
    std::memcpy(values_.data() + i * F, grid + size_t{rows_[i]} * F, F * sizeof(float));
  GRIDSYNC_RETURN_IF_ERROR(trainer_->UploadGridRows(rows_.data(), rows_.size(), values_.data()));
  std::vector<std::span<const float>> mlp;
  for (const auto& m : model_->mlp_weights())
    mlp.emplace_back(m.data(), static_cast<size_t>(m.size()));
  GRIDSYNC_RETURN_IF_ERROR(trainer_->UploadMlp(mlp));
  return batch;
}

Result<double> DeviceStagedSync::TrainStep(const StepBatch& batch, size_t global_batch,
                                           uint32_t active_levels, float loss_scale,
                                           SyncOutcome* outcome) {
  GRIDSYNC_ASSIGN_OR_RETURN(
      const double sse,
      ComputeBatchGradients(*trainer_, batch, global_batch, active_levels, loss_scale,
                            static_cast<uint64_t>(config_.training.gradient_accumulation)));
  // Only the rows the batch read can have a gradient: they come back, and
  // are zeroed on the device.
  GRIDSYNC_RETURN_IF_ERROR(
      trainer_->TakeGridGradientRows(rows_.data(), rows_.size(), values_.data()));
  const auto& layout = model_->layout();
  const uint32_t F = layout.features();
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    const size_t begin = level_begin_[l], end = level_begin_[l + 1];
    const auto& local = row_set_.rows(l);
    grads_.grid.AddRows(l, local.data(), end - begin, values_.data() + begin * F);
  }
  std::vector<std::span<float>> mlp;
  for (auto& m : grads_.mlp) mlp.emplace_back(m.data(), static_cast<size_t>(m.size()));
  GRIDSYNC_RETURN_IF_ERROR(trainer_->TakeMlpGradients(mlp));
  GRIDSYNC_ASSIGN_OR_RETURN(*outcome, host_->Apply(step_, &grads_, loss_scale));
  return sse;
}

Result<SyncOutcome> DeviceStagedSync::Apply(uint64_t, ModelGradients*, float) {
  return Status::Internal("DeviceStagedSync::Apply: the step is applied by TrainStep");
}

Result<uint64_t> DeviceStagedSync::Recover(const Status& failure) {
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t resumed, host_->Recover(failure));
  // The step that failed is computed again from zero; the device's rows are
  // staged again from the rolled-back host model by the next Prepare.
  GRIDSYNC_RETURN_IF_ERROR(trainer_->ClearGradients());
  grads_.Clear(pool_);
  return resumed;
}

void DeviceStagedSync::FillReport(TrainReport* report) const {
  host_->FillReport(report);
  FillTraffic(*trainer_, report);
}

}  // namespace gridsync
