#include "worker/sync/device_sync.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"

namespace gridsync {

Result<std::unique_ptr<cuda::DeviceTrainer>> MakeDeviceTrainer(const RunSpec& spec,
                                                               const HashGridModel& model,
                                                               int device) {
  std::vector<std::vector<float>> mlp;
  for (const auto& m : model.mlp_weights()) mlp.emplace_back(m.data(), m.data() + m.size());
  return cuda::DeviceTrainer::Create(
      model.layout(), model.mlp_shape(), spec.model.adam, model.grid_params(), mlp, device,
      static_cast<size_t>(spec.config.training.batch_size), spec.config.training.mixed_precision);
}

Result<std::unique_ptr<cuda::DeviceTrainer>> PickTrainer(const RunSpec& spec,
                                                         const HashGridModel& model, int local_rank,
                                                         const WorkerOptions& options, bool quiet) {
  if (options.make_trainer) return options.make_trainer(spec, model);
  const TrainingDevice device = spec.config.training.device;
  if (device == TrainingDevice::kCpu) return std::unique_ptr<cuda::DeviceTrainer>();
  std::string why_cpu;
  std::string reason;
  if (device == TrainingDevice::kAuto && !cuda::Available(&reason)) {
    why_cpu = "training.device auto: " + reason;
  } else {
    // One rank per GPU: local rank modulo the devices this process sees.
    const Result<int> gpu = cuda::DeviceForLocalRank(local_rank);
    auto trainer = gpu.ok() ? MakeDeviceTrainer(spec, model, *gpu)
                            : Result<std::unique_ptr<cuda::DeviceTrainer>>(gpu.status());
    if (trainer.ok()) {
      if (!quiet) spdlog::info("training on {}", (*trainer)->device_name());
      return trainer;
    }
    if (device == TrainingDevice::kCuda)
      return trainer.status().WithContext("training.device cuda");
    why_cpu = "training.device auto: the GPU could not be used: " + trainer.status().ToString();
  }
  if (!quiet) spdlog::info("training on the CPU ({})", why_cpu);
  return std::unique_ptr<cuda::DeviceTrainer>();
}

Result<double> ComputeBatchGradients(cuda::DeviceTrainer& trainer, const StepBatch& batch,
                                     size_t global_batch, uint32_t active_levels, float loss_scale,
                                     uint64_t accumulation, bool begin_last, bool round_to_half) {
  std::vector<std::pair<uint64_t, uint64_t>> parts;  // offset, count
  uint64_t offset = 0;
  for (uint64_t m = 0; m < accumulation; ++m) {
    const uint64_t part = batch.count / accumulation + (m < batch.count % accumulation ? 1 : 0);
    if (part == 0) continue;  // a share smaller than the micro-batch count
    parts.emplace_back(offset, part);
    offset += part;
  }
  if (begin_last && parts.empty()) parts.emplace_back(0, 0);
  double sse = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto [begin, count] = parts[i];
    const float* positions = batch.positions.data() + begin * 2;
    const float* targets = batch.targets.data() + begin * 3;
    if (begin_last && i + 1 == parts.size()) {
      GRIDSYNC_RETURN_IF_ERROR(trainer.BeginGradients(positions, targets, count, global_batch,
                                                      active_levels, loss_scale, round_to_half));
      break;
    }
    GRIDSYNC_ASSIGN_OR_RETURN(const double part_sse,
                              trainer.ComputeGradients(positions, targets, count, global_batch,
                                                       active_levels, loss_scale));
    sse += part_sse;
  }
  return sse;
}

Status CopyTrainerToModel(cuda::DeviceTrainer& trainer, HashGridModel* model) {
  std::vector<std::vector<float>> mlp;
  GRIDSYNC_RETURN_IF_ERROR(trainer.Download(&model->grid_params(), &mlp));
  auto& weights = model->mlp_weights();
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
  model->RefreshWorkingCopyAll();
  return Status::OK();
}

void FillTraffic(const cuda::DeviceTrainer& trainer, TrainReport* report) {
  report->device = trainer.device_name();
  const auto traffic = trainer.traffic();
  report->kernel_bytes = traffic.bytes;
  report->kernel_seconds = traffic.seconds;
  report->kernel_peak_bytes_per_second = traffic.peak_bytes_per_second;
  report->kernel_forward_seconds = traffic.forward_seconds;
  report->kernel_grid_backward_seconds = traffic.grid_backward_seconds;
  report->kernel_grid_adam_seconds = traffic.grid_adam_seconds;
}

DeviceSync::DeviceSync(const RunSpec& spec, HashGridModel* model, const BatchSource* source,
                       std::unique_ptr<cuda::DeviceTrainer> trainer)
    : config_(spec.config), model_(model), source_(source), trainer_(std::move(trainer)) {
  me_ = "standalone (" + trainer_->device_name() + ")";
}

Result<const StepBatch*> DeviceSync::Prepare(uint64_t step) {
  source_->Fill(step, 0, static_cast<uint64_t>(config_.training.batch_size), &batch_);
  return &batch_;
}

Result<double> DeviceSync::TrainStep(const StepBatch& batch, size_t global_batch,
                                     uint32_t active_levels, float loss_scale,
                                     SyncOutcome* outcome) {
  GRIDSYNC_ASSIGN_OR_RETURN(
      const double sse,
      ComputeBatchGradients(*trainer_, batch, global_batch, active_levels, loss_scale,
                            static_cast<uint64_t>(config_.training.gradient_accumulation)));
  outcome->finite = true;
  if (config_.training.mixed_precision) {
    GRIDSYNC_ASSIGN_OR_RETURN(outcome->finite, trainer_->RoundGradientsToHalf());
  }
  GRIDSYNC_RETURN_IF_ERROR(outcome->finite ? trainer_->ApplyGradients(loss_scale)
                                           : trainer_->ClearGradients());
  return sse;
}

Result<SyncOutcome> DeviceSync::Apply(uint64_t, ModelGradients*, float) {
  return Status::Internal("DeviceSync::Apply: the device trainer applies its own steps");
}

Result<HashGridModel*> DeviceSync::Snapshot(uint64_t) {
  GRIDSYNC_RETURN_IF_ERROR(CopyTrainerToModel(*trainer_, model_));
  return static_cast<HashGridModel*>(nullptr);  // the host model is current now
}

Status DeviceSync::Finish(uint64_t, TrainReport*) { return CopyTrainerToModel(*trainer_, model_); }

void DeviceSync::FillReport(TrainReport* report) const { FillTraffic(*trainer_, report); }

}  // namespace gridsync
