// Standalone training on a CUDA device (training.device cuda): the model,
// its gradients and Adam's state live on the GPU (kernels/cuda/
// device_trainer.h), and a step is one call that computes the gradient of
// the global batch and applies it there. The host model is brought up to
// date only when it is read: an evaluation mid-run (Snapshot) and the end of
// the run (Finish).
//
// Thread safety: see gradient_sync.h.
#pragma once

#include <memory>

#include "kernels/cuda/device_trainer.h"
#include "worker/sync/gradient_sync.h"

namespace gridsync {

class DeviceSync : public GradientSync {
 public:
  DeviceSync(const RunSpec& spec, HashGridModel* model, const BatchSource* source,
             std::unique_ptr<cuda::DeviceTrainer> trainer);

  // The trainer for `model` on `device`: its parameters copied to the GPU,
  // batches of up to training.batch_size samples.
  static Result<std::unique_ptr<cuda::DeviceTrainer>> MakeTrainer(const RunSpec& spec,
                                                                  const HashGridModel& model,
                                                                  int device);

  Result<const StepBatch*> Prepare(uint64_t step) override;
  bool trains_steps() const override { return true; }
  Result<double> TrainStep(const StepBatch& batch, size_t global_batch,
                           uint32_t active_levels) override;
  Result<SyncOutcome> Apply(uint64_t step, ModelGradients* grads, float loss_scale) override;
  Result<HashGridModel*> Snapshot(uint64_t done) override;
  Status Finish(uint64_t end_step, TrainReport* report) override;
  Result<std::vector<double>> GatherRates(uint64_t, double mine) override {
    return std::vector<double>{mine};
  }

 private:
  // Copies the device's parameters into the host model.
  Status DownloadModel();

  const Config& config_;
  HashGridModel* model_;
  const BatchSource* source_;
  std::unique_ptr<cuda::DeviceTrainer> trainer_;
  StepBatch batch_;
};

}  // namespace gridsync
