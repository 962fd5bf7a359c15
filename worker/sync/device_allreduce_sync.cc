#include "worker/sync/device_allreduce_sync.h"

#include <chrono>
#include <string>
#include <utility>

#include "worker/sync/allreduce_sync.h"
#include "worker/sync/device_sync.h"
#include "worker/sync/peer_watch.h"

namespace gridsync {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

bool DeviceAllReduceSync::Serves(const RunSpec& spec) {
  const auto& d = spec.config.distributed;
  // Any codec goes to AllReduceSync (16-bit all-reduces run there; it
  // refuses the others by name).
  return !d.hierarchical && !d.model_parallel && spec.compression.codec.codec == Codec::kNone;
}

DeviceAllReduceSync::DeviceAllReduceSync(const RunSpec& spec, HashGridModel* model, int rank,
                                         Collective* flat, CoordinatorClient* coordinator,
                                         const BatchSource* source, const SplitSchedule* split,
                                         std::unique_ptr<cuda::DeviceTrainer> trainer)
    : config_(spec.config),
      model_(model),
      flat_(flat),
      coordinator_(coordinator),
      source_(source),
      split_(split),
      trainer_(std::move(trainer)) {
  rank_ = static_cast<uint32_t>(rank);
  me_ = "worker-" + std::to_string(rank) + " (" + trainer_->device_name() + ")";
  for (const auto& buffer : trainer_->GradientBuffers()) elements_ += buffer.size();
  buckets_ = trainer_->CutBuckets(spec.sync.bucket_bytes);
  enqueue_ = trainer_->gradients_on_device() && flat_->enqueues_on_device();
  if (trainer_->gradients_on_device() && !enqueue_) {
    for (const auto& bucket : buckets_) {
      host_.emplace_back();
      for (const auto& buffer : bucket) host_.back().emplace_back(buffer.size());
    }
  }
}

Result<const StepBatch*> DeviceAllReduceSync::Prepare(uint64_t step) {
  const BatchSplit& split = split_->At(step);
  source_->Fill(step, split.begin(static_cast<int>(rank_)), split.count(static_cast<int>(rank_)),
                &batch_);
  return &batch_;
}

Status DeviceAllReduceSync::ReduceBuckets() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (enqueue_) {
      // NCCL's stream waits for the bucket on the device; nothing waits here.
      GRIDSYNC_RETURN_IF_ERROR(
          flat_->EnqueueAllReduceSumGroup(buckets_[b], trainer_->BucketReady(b)));
    } else if (!host_.empty()) {
      // Gloo reads host memory: each bucket is copied out once final, while
      // the device computes the next.
      std::vector<std::span<float>> host(host_[b].begin(), host_[b].end());
      GRIDSYNC_RETURN_IF_ERROR(trainer_->CopyBucket(b, host, /*to_device=*/false));
      GRIDSYNC_RETURN_IF_ERROR(flat_->AllReduceSumGroup(host));
      GRIDSYNC_RETURN_IF_ERROR(trainer_->CopyBucket(b, host, /*to_device=*/true));
    } else {
      GRIDSYNC_RETURN_IF_ERROR(flat_->AllReduceSumGroup(buckets_[b]));  // the CPU twin's
    }
  }
  return enqueue_ ? flat_->WaitEnqueued() : Status::OK();
}

Result<double> DeviceAllReduceSync::TrainStep(const StepBatch& batch, size_t global_batch,
                                              uint32_t active_levels, float loss_scale,
                                              SyncOutcome* outcome) {
  ++applies_;
  const bool mixed = config_.training.mixed_precision;
  // The last micro-batch's backward pass is only begun: each bucket is
  // reduced as soon as it is final.
  GRIDSYNC_ASSIGN_OR_RETURN(
      double sse,
      ComputeBatchGradients(*trainer_, batch, global_batch, active_levels, loss_scale,
                            static_cast<uint64_t>(config_.training.gradient_accumulation),
                            /*begin_last=*/true, /*round_to_half=*/mixed));
  const auto start = Clock::now();
  Status reduced = ReduceBuckets();
  // Waited for even after a failure: the pass must end before the buffers
  // are touched again.
  const auto finished = trainer_->FinishGradients();
  if (reduced.ok()) reduced = finished.status();
  float overflow = 0.0f;  // summed: the number of workers that overflowed
  if (reduced.ok() && mixed) {
    overflow = finished->fits ? 0.0f : 1.0f;
    reduced = flat_->AllReduceSum(&overflow, 1);
  }
  comm_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  if (!reduced.ok()) {
    (void)trainer_->ClearGradients();  // the step is computed again if the job goes on
    return reduced;
  }
  sse += finished->sse;
  outcome->finite = overflow == 0.0f;
  outcome->grid_rows = 0;  // the device does not count the rows it updates
  GRIDSYNC_RETURN_IF_ERROR(outcome->finite ? trainer_->ApplyGradients(loss_scale)
                                           : trainer_->ClearGradients());
  return sse;
}

Result<SyncOutcome> DeviceAllReduceSync::Apply(uint64_t, ModelGradients*, float) {
  return Status::Internal("DeviceAllReduceSync::Apply: the device trainer applies its own steps");
}

Result<HashGridModel*> DeviceAllReduceSync::Snapshot(uint64_t) {
  GRIDSYNC_RETURN_IF_ERROR(CopyTrainerToModel(*trainer_, model_));
  return static_cast<HashGridModel*>(nullptr);  // the host model is current now
}

Status DeviceAllReduceSync::Finish(uint64_t, TrainReport*) {
  return CopyTrainerToModel(*trainer_, model_);
}

Result<std::vector<double>> DeviceAllReduceSync::GatherRates(uint64_t, double mine) {
  return GatherRatesAcross(*flat_, mine);
}

Status DeviceAllReduceSync::CheckPeers() {
  return coordinator_ ? CheckClusterPeers(*coordinator_) : Status::OK();
}

double DeviceAllReduceSync::BytesPerStep() const {
  return static_cast<double>(elements_ * sizeof(float));
}

SyncTimes DeviceAllReduceSync::times() const {
  SyncTimes t;
  t.allreduce_seconds = comm_seconds_;
  t.bytes_sent = t.bytes_received = BytesPerStep() * static_cast<double>(applies_);
  return t;
}

void DeviceAllReduceSync::FillReport(TrainReport* report) const {
  report->bytes_pushed_per_step = BytesPerStep();
  report->bytes_pulled_per_step = 0;
  report->comm_seconds = comm_seconds_;
  FillTraffic(*trainer_, report);
}

}  // namespace gridsync
