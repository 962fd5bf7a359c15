// gradient_sync "nccl" with the model on a GPU: every worker keeps the whole
// model on its device, computes the gradient of its share of each global
// batch there, and the gradient buffers are summed across workers in place,
// then every worker takes the same Adam step on its device. Gradients never
// leave the device with NCCL.
//
// The sum overlaps the backward pass: the buffers are cut into buckets
// (distributed.bucket_mb) in the order the pass finishes them, the MLP's
// matrices first, then the grid's levels, finest (largest) first. With
// NCCL, each bucket's ncclGroup is enqueued on the collective's own stream
// behind the device event that marks it final, so the device reduces one
// bucket while it computes the next; with Gloo, each bucket is copied out
// on a copy stream once final and summed on the host while the device goes
// on. Only the last micro-batch of a step overlaps (the others add into the
// same buffers).
//
// This covers the flat fp32 all-reduce without a codec. The hierarchical
// scheme, the sharded update (distributed.model_parallel) and the 16-bit
// all-reduce (compression.codec fp16/bf16) run on the host (device_staged_sync.h
// around AllReduceSync).
//
// Mixed precision: each worker rounds its gradient through fp16 on the
// device and adds its overflow flag to a one-float all-reduce, so every
// worker skips (or applies) the step alike.
//
// Thread safety: see gradient_sync.h.
#pragma once

#include <memory>
#include <vector>

#include "common/coordinator_client.h"
#include "kernels/cuda/device_trainer.h"
#include "spec/run_spec.h"
#include "worker/collective/collective.h"
#include "worker/sync/gradient_sync.h"

namespace gridsync {

class DeviceAllReduceSync : public GradientSync {
 public:
  // Whether this sync serves `spec` (else the staged one does; see above).
  static bool Serves(const RunSpec& spec);

  // coordinator: watched between steps when given (null in in-process tests).
  DeviceAllReduceSync(const RunSpec& spec, HashGridModel* model, int rank, Collective* flat,
                      CoordinatorClient* coordinator, const BatchSource* source,
                      const SplitSchedule* split, std::unique_ptr<cuda::DeviceTrainer> trainer);

  Result<const StepBatch*> Prepare(uint64_t step) override;
  bool trains_steps() const override { return true; }
  Result<double> TrainStep(const StepBatch& batch, size_t global_batch, uint32_t active_levels,
                           float loss_scale, SyncOutcome* outcome) override;
  Result<SyncOutcome> Apply(uint64_t step, ModelGradients* grads, float loss_scale) override;
  Result<HashGridModel*> Snapshot(uint64_t done) override;
  Status Finish(uint64_t end_step, TrainReport* report) override;
  Result<std::vector<double>> GatherRates(uint64_t done, double mine) override;
  Status CheckPeers() override;
  void FillReport(TrainReport* report) const override;
  SyncTimes times() const override;

 private:
  // Sums each bucket across workers, in place, as the backward pass
  // finishes it.
  Status ReduceBuckets();
  double BytesPerStep() const;

  const Config& config_;
  HashGridModel* model_;
  Collective* flat_;
  CoordinatorClient* coordinator_;
  const BatchSource* source_;
  const SplitSchedule* split_;
  std::unique_ptr<cuda::DeviceTrainer> trainer_;
  // The gradient buffers cut into buckets (distributed.bucket_mb), in the
  // order the backward pass finishes them.
  std::vector<std::vector<std::span<float>>> buckets_;
  // NCCL: every bucket enqueued behind the device's event for it.
  bool enqueue_ = false;
  // Staging for a collective on host memory (Gloo) when the buffers are on
  // the device, bucket by bucket; empty otherwise.
  std::vector<std::vector<std::vector<float>>> host_;
  size_t elements_ = 0;  // gradient elements all-reduced per step
  StepBatch batch_;
  double comm_seconds_ = 0;
  uint64_t applies_ = 0;
};

}  // namespace gridsync
