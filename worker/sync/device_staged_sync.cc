#include "worker/sync/device_staged_sync.h"

#include <cstring>
#include <string>
#include <utility>

#include "worker/ps_client.h"
#include "worker/sync/device_sync.h"
#include "worker/sync/hybrid_sync.h"

namespace gridsync {
namespace {

// The PS client's blocks of grid levels (tables 0 .. levels - 1, the PS
// model's numbering) as the trainer's push blocks.
class TrainerPushSource : public DevicePushSource {
 public:
  explicit TrainerPushSource(cuda::DeviceTrainer* trainer) : trainer_(trainer) {}
  Status Fetch(uint32_t table, uint32_t col_begin, uint32_t width, const uint32_t* rows, size_t n,
               float* values) override {
    return trainer_->FetchPushBlock({table, col_begin, width, rows, n}, values);
  }
  Status Encode(uint32_t table, uint32_t col_begin, uint32_t width, const uint32_t* rows, size_t n,
                const CodecOptions& options, uint64_t seed, bool feedback, bool mask_momentum,
                uint8_t* payload) override {
    return trainer_->EncodePushBlock({table, col_begin, width, rows, n}, options, seed, feedback,
                                     mask_momentum, payload);
  }
  Status ToUpdates(uint32_t table, const uint32_t* rows, size_t n,
                   std::vector<uint32_t>* kept) override {
    return trainer_->GridWorkerAdam(table, rows, n, kept);
  }
  Status CopyAdamState(uint32_t table, cpu::AdamTable* state) override {
    return trainer_->CopyGridAdamState(table, state->m.data(), state->v.data(), state->step.data());
  }
  Status LoadAdamState(uint32_t table, const cpu::AdamTable* state) override {
    if (state == nullptr) return trainer_->LoadGridAdamState(table, nullptr, nullptr, nullptr);
    return trainer_->LoadGridAdamState(table, state->m.data(), state->v.data(), state->step.data());
  }
  Status CopyResidualsTo(cpu::ErrorFeedback* into) override {
    return trainer_->CopyResidualsTo(into);
  }
  Status LoadResiduals(const cpu::ErrorFeedback& from) override {
    return trainer_->LoadResiduals(from);
  }

 private:
  cuda::DeviceTrainer* trainer_;
};

}  // namespace

std::unique_ptr<DevicePushSource> MakeTrainerPushSource(cuda::DeviceTrainer* trainer) {
  return std::make_unique<TrainerPushSource>(trainer);
}

Result<std::unique_ptr<DeviceStagedSync>> DeviceStagedSync::Create(
    const RunSpec& spec, HashGridModel* model, std::unique_ptr<GradientSync> host,
    std::unique_ptr<cuda::DeviceTrainer> trainer, ThreadPool* pool) {
  std::unique_ptr<DeviceStagedSync> sync(
      new DeviceStagedSync(spec, model, std::move(host), std::move(trainer), pool));
  PsClient* ps = sync->host_->ps_client();
  const GradientSyncMode mode = spec.config.distributed.gradient_sync;
  if (ps == nullptr) return sync;
  // hybrid sums the node's gradients where they are, then pushes as ps
  // does with a codec (without one, each block's values are fetched).
  HybridSync* hybrid = nullptr;
  if (mode == GradientSyncMode::kHybrid) {
    hybrid = dynamic_cast<HybridSync*>(sync->host_.get());
    if (hybrid == nullptr)
      return Status::Internal("DeviceStagedSync: gradient_sync hybrid without a HybridSync");
  } else if (mode != GradientSyncMode::kPs || spec.compression.codec.codec == Codec::kNone) {
    return sync;
  }
  sync->push_source_ = MakeTrainerPushSource(sync->trainer_.get());
  std::vector<uint32_t> levels(model->layout().n_levels());
  for (uint32_t l = 0; l < levels.size(); ++l) levels[l] = l;
  GRIDSYNC_RETURN_IF_ERROR(ps->SetDevicePushSource(sync->push_source_.get(), levels));
  if (hybrid != nullptr) {
    hybrid->SumOnDevice(sync->trainer_.get());
    sync->hybrid_ = hybrid;
  }
  return sync;
}

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
    cuda::DeviceTrainer* device = trainer_.get();
    ps->SetBlockEncoder([device](const CodecOptions& options, const float* values, size_t n,
                                 uint64_t seed, uint8_t* payload, float* decoded) {
      return device->EncodeBlock(options, values, n, seed, payload, decoded);
    });
  }
}

DeviceStagedSync::~DeviceStagedSync() {
  // The client outlives the trainer its encoder and push source call.
  if (hybrid_ != nullptr) hybrid_->SumOnDevice(nullptr);
  if (PsClient* ps = host_->ps_client(); ps != nullptr) {
    ps->SetBlockEncoder(nullptr);
    // Detaching copies the residuals back; after the run no one reads them.
    (void)ps->SetDevicePushSource(nullptr);
  }
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
  // Worker Adam with error feedback: the updates not delivered yet join the
  // rows where they are read (the client left them out; see
  // PsClient::GatherPendingUpdates). hybrid added them to its slice's rows
  // before the node shared them.
  if (PsClient* ps = host_->ps_client();
      encodes_on_device() && hybrid_ == nullptr && ps != nullptr && ps->adds_pending_updates()) {
    GRIDSYNC_RETURN_IF_ERROR(trainer_->AddResidualsToGridRows(rows_.data(), rows_.size()));
  }
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
  // are zeroed on the device; or they stay there for the push to encode.
  const auto& layout = model_->layout();
  const uint32_t F = layout.features();
  if (hybrid_ != nullptr) {
    // Every gradient stays here for the node's sum (HybridSync::Apply).
    for (uint32_t l = 0; l < layout.n_levels(); ++l) {
      const auto& local = row_set_.rows(l);
      grads_.grid.MarkRows(l, local.data(), local.size());
    }
    grads_.sums_on_device = true;
    auto applied = host_->Apply(step_, &grads_, loss_scale);
    grads_.sums_on_device = false;
    GRIDSYNC_ASSIGN_OR_RETURN(*outcome, std::move(applied));
    return sse;
  }
  if (encodes_on_device()) {
    GRIDSYNC_ASSIGN_OR_RETURN(
        grads_.grid_fits,
        trainer_->PrepareGridPush(rows_.data(), rows_.size(), config_.training.mixed_precision,
                                  1.0f / loss_scale));
    grads_.grid_on_device = true;
  } else {
    GRIDSYNC_RETURN_IF_ERROR(
        trainer_->TakeGridGradientRows(rows_.data(), rows_.size(), values_.data()));
  }
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    const size_t begin = level_begin_[l], end = level_begin_[l + 1];
    const auto& local = row_set_.rows(l);
    if (encodes_on_device()) {
      grads_.grid.MarkRows(l, local.data(), end - begin);
    } else {
      grads_.grid.AddRows(l, local.data(), end - begin, values_.data() + begin * F);
    }
  }
  std::vector<std::span<float>> mlp;
  for (auto& m : grads_.mlp) mlp.emplace_back(m.data(), static_cast<size_t>(m.size()));
  GRIDSYNC_RETURN_IF_ERROR(trainer_->TakeMlpGradients(mlp));
  auto applied = host_->Apply(step_, &grads_, loss_scale);
  if (encodes_on_device()) {
    grads_.grid_on_device = false;
    grads_.grid_fits = true;
    // Pushed (or skipped, or failed: the step is computed again).
    GRIDSYNC_RETURN_IF_ERROR(trainer_->ZeroGridGradientRows(rows_.data(), rows_.size()));
  }
  GRIDSYNC_ASSIGN_OR_RETURN(*outcome, std::move(applied));
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
