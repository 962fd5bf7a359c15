// The model on a CUDA device (training.device cuda; kernels/cuda/
// device_trainer.h): the standalone sync, and what every device sync shares.
//
// DeviceSync trains one process: a step is one TrainStep that computes the
// gradient of the global batch and applies it on the device. The host model
// is brought up to date only when it is read: an evaluation mid-run
// (Snapshot) and the end of the run (Finish). The sync modes have their own
// device syncs: device_allreduce_sync.h (nccl) and device_staged_sync.h
// (ps, hybrid, and the all-reduce variants that run on the host).
//
// Thread safety: see gradient_sync.h.
#pragma once

#include <memory>

#include "common/thread_pool.h"
#include "kernels/cuda/device_trainer.h"
#include "spec/run_spec.h"
#include "worker/sync/gradient_sync.h"
#include "worker/sync/train_report.h"

namespace gridsync {

// The trainer for `model` on `device`: its parameters copied to the GPU,
// batches of up to training.batch_size samples, mixed precision as
// configured.
Result<std::unique_ptr<cuda::DeviceTrainer>> MakeDeviceTrainer(const RunSpec& spec,
                                                               const HashGridModel& model,
                                                               int device);

// Where this worker's model trains, decided once: the trainer when it
// trains on a GPU (training.device cuda, or auto with a device present; the
// device is local_rank's, after CUDA_VISIBLE_DEVICES), or null for the CPU,
// saying why in the log unless `quiet`. options.make_trainer (a test seam)
// takes precedence. cuda that cannot run fails naming why.
Result<std::unique_ptr<cuda::DeviceTrainer>> PickTrainer(const RunSpec& spec,
                                                         const HashGridModel& model, int local_rank,
                                                         const WorkerOptions& options, bool quiet);

// The gradient of `batch` at `loss_scale`, added to the trainer's buffers in
// training.gradient_accumulation micro-batches, as the loop cuts them on the
// CPU. Returns the batch's sum of squared errors. With `begin_last`, the
// last micro-batch (an empty one if the share is empty) is only begun
// (BeginGradients, rounding through fp16 with `round_to_half`): the caller
// reduces its buckets as they are final and calls FinishGradients, whose
// sum is not in the one returned.
Result<double> ComputeBatchGradients(cuda::DeviceTrainer& trainer, const StepBatch& batch,
                                     size_t global_batch, uint32_t active_levels, float loss_scale,
                                     uint64_t accumulation, bool begin_last = false,
                                     bool round_to_half = false);

// Copies the trainer's parameters into `model` (and its working copy).
Status CopyTrainerToModel(cuda::DeviceTrainer& trainer, HashGridModel* model);

class DeviceSync : public GradientSync {
 public:
  DeviceSync(const RunSpec& spec, HashGridModel* model, const BatchSource* source,
             std::unique_ptr<cuda::DeviceTrainer> trainer);

  Result<const StepBatch*> Prepare(uint64_t step) override;
  bool trains_steps() const override { return true; }
  Result<double> TrainStep(const StepBatch& batch, size_t global_batch, uint32_t active_levels,
                           float loss_scale, SyncOutcome* outcome) override;
  Result<SyncOutcome> Apply(uint64_t step, ModelGradients* grads, float loss_scale) override;
  Result<HashGridModel*> Snapshot(uint64_t done) override;
  Status Finish(uint64_t end_step, TrainReport* report) override;
  Result<std::vector<double>> GatherRates(uint64_t, double mine) override {
    return std::vector<double>{mine};
  }
  void FillReport(TrainReport* report) const override;

 private:
  const Config& config_;
  HashGridModel* model_;
  const BatchSource* source_;
  std::unique_ptr<cuda::DeviceTrainer> trainer_;
  StepBatch batch_;
};

// The kernels' achieved memory bandwidth, for the report (zeros off a GPU).
void FillTraffic(const cuda::DeviceTrainer& trainer, TrainReport* report);

}  // namespace gridsync
