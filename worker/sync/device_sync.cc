#include "worker/sync/device_sync.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace gridsync {

DeviceSync::DeviceSync(const RunSpec& spec, HashGridModel* model, const BatchSource* source,
                       std::unique_ptr<cuda::DeviceTrainer> trainer)
    : config_(spec.config), model_(model), source_(source), trainer_(std::move(trainer)) {
  me_ = "standalone (" + trainer_->device_name() + ")";
}

Result<std::unique_ptr<cuda::DeviceTrainer>> DeviceSync::MakeTrainer(const RunSpec& spec,
                                                                     const HashGridModel& model,
                                                                     int device) {
  std::vector<std::vector<float>> mlp;
  for (const auto& m : model.mlp_weights()) mlp.emplace_back(m.data(), m.data() + m.size());
  return cuda::DeviceTrainer::Create(model.layout(), model.mlp_shape(), spec.model.adam,
                                     model.grid_params(), mlp, device,
                                     static_cast<size_t>(spec.config.training.batch_size));
}

Result<const StepBatch*> DeviceSync::Prepare(uint64_t step) {
  source_->Fill(step, 0, static_cast<uint64_t>(config_.training.batch_size), &batch_);
  return &batch_;
}

Result<double> DeviceSync::TrainStep(const StepBatch& batch, size_t global_batch,
                                     uint32_t active_levels) {
  return trainer_->Step(batch.positions.data(), batch.targets.data(), batch.count, global_batch,
                        active_levels);
}

Result<SyncOutcome> DeviceSync::Apply(uint64_t, ModelGradients*, float) {
  return Status::Internal("DeviceSync::Apply: the device trainer applies its own steps");
}

Status DeviceSync::DownloadModel() {
  std::vector<std::vector<float>> mlp;
  GRIDSYNC_RETURN_IF_ERROR(trainer_->Download(&model_->grid_params(), &mlp));
  auto& weights = model_->mlp_weights();
  if (mlp.size() != weights.size()) {
    return Status::Internal("the device sent " + std::to_string(mlp.size()) +
                            " MLP matrices; the model has " + std::to_string(weights.size()));
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    if (mlp[i].size() != static_cast<size_t>(weights[i].size())) {
      return Status::Internal("the device's MLP matrix " + std::to_string(i) +
                              " has another size than the model's");
    }
    std::memcpy(weights[i].data(), mlp[i].data(), mlp[i].size() * sizeof(float));
  }
  model_->RefreshWorkingCopyAll();
  return Status::OK();
}

Result<HashGridModel*> DeviceSync::Snapshot(uint64_t) {
  GRIDSYNC_RETURN_IF_ERROR(DownloadModel());
  return static_cast<HashGridModel*>(nullptr);  // the host model is current now
}

Status DeviceSync::Finish(uint64_t, TrainReport*) { return DownloadModel(); }

}  // namespace gridsync
