// A host sync (ps, hybrid, or an all-reduce variant that runs on the host)
// with the model's compute on a GPU. The host model stays what the sync
// keeps current (pulled rows, the node's share, the host optimizer's
// result); the device holds a copy of the rows each batch reads:
//
//   Prepare(step):  the host sync prepares the batch (pulls its rows); the
//                   rows the batch reads and the MLP are staged to the device
//                   through pinned memory (only those rows)
//   TrainStep:      the gradient is computed on the device; only the touched
//                   rows and the MLP's gradients come back, into host
//                   ModelGradients, and the host sync's Apply pushes them
//                   (error feedback and mixed precision's fp16 check run
//                   there, as on the CPU; the codecs run on the device, the
//                   PS client's BlockEncoder being the trainer's EncodeBlock)
//
// In ps with a codec, the grid's rows do not come back: the device rounds
// and unscales them in place (PrepareGridPush), the host's ModelGradients
// only marks them (grid_on_device), and the PS client, through a
// DevicePushSource, has them turned into updates there with Adam on the
// worker (GridWorkerAdam) and each push block encoded there
// (EncodePushBlock), error feedback included, so that only payloads are
// copied. The residuals and worker Adam's grid state then live on the
// device: the client copies them back for its flush and checkpoints and
// loads them there on a restore, and the pending updates join freshly
// uploaded rows there (AddResidualsToGridRows). In hybrid, nothing comes
// back after the pass: the node's sum runs on the device's gradients
// (HybridSync::SumOnDevice), and the slice each worker pushes is encoded
// there as in ps with a codec (without one, only the slice's rows with a
// gradient come back, block by block).
//
// Everything else (evaluations, the final model, rates, peers, rollback)
// is the host sync's. Rows the batch does not read may be stale on the
// device; no step reads them before they are staged again.
//
// Thread safety: see gradient_sync.h.
#pragma once

#include <memory>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/hash_encoding.h"
#include "kernels/cuda/device_trainer.h"
#include "spec/run_spec.h"
#include "worker/ps_client.h"
#include "worker/sync/gradient_sync.h"

namespace gridsync {

class HybridSync;

// The PS client's DevicePushSource backed by `trainer` (not owned): the
// grid's levels are the PS model's tables 0 .. levels - 1.
std::unique_ptr<DevicePushSource> MakeTrainerPushSource(cuda::DeviceTrainer* trainer);

class DeviceStagedSync : public GradientSync {
 public:
  static Result<std::unique_ptr<DeviceStagedSync>> Create(
      const RunSpec& spec, HashGridModel* model, std::unique_ptr<GradientSync> host,
      std::unique_ptr<cuda::DeviceTrainer> trainer, ThreadPool* pool);
  ~DeviceStagedSync() override;

  Result<const StepBatch*> Prepare(uint64_t step) override;
  bool trains_steps() const override { return true; }
  Result<double> TrainStep(const StepBatch& batch, size_t global_batch, uint32_t active_levels,
                           float loss_scale, SyncOutcome* outcome) override;
  Result<SyncOutcome> Apply(uint64_t step, ModelGradients* grads, float loss_scale) override;
  Result<HashGridModel*> Snapshot(uint64_t done) override { return host_->Snapshot(done); }
  Status Finish(uint64_t end_step, TrainReport* report) override {
    return host_->Finish(end_step, report);
  }
  Result<std::vector<double>> GatherRates(uint64_t done, double mine) override {
    return host_->GatherRates(done, mine);
  }
  Status CheckPeers() override { return host_->CheckPeers(); }
  Result<uint64_t> Recover(const Status& failure) override;
  void FillReport(TrainReport* report) const override;
  SyncTimes times() const override { return host_->times(); }
  // Whether the pushes' grid rows are encoded on the device (see above).
  bool encodes_on_device() const { return push_source_ != nullptr; }

 private:
  DeviceStagedSync(const RunSpec& spec, HashGridModel* model, std::unique_ptr<GradientSync> host,
                   std::unique_ptr<cuda::DeviceTrainer> trainer, ThreadPool* pool);

  const Config& config_;
  HashGridModel* model_;
  std::unique_ptr<GradientSync> host_;
  std::unique_ptr<cuda::DeviceTrainer> trainer_;
  ThreadPool* pool_;
  uint64_t step_ = 0;  // of the prepared batch
  cpu::GridBatchLookup lookup_;
  cpu::GridRowSet row_set_;
  std::vector<uint32_t> rows_;       // the prepared batch's rows, global ids, level by level
  std::vector<size_t> level_begin_;  // rows_[level_begin_[l], level_begin_[l + 1]) is level l
  std::vector<float> values_;        // staged rows (parameters in, gradients out)
  ModelGradients grads_;
  std::unique_ptr<DevicePushSource> push_source_;  // null: rows come back
  HybridSync* hybrid_ = nullptr;                   // host_, summing the node on the device
};

}  // namespace gridsync
