#include "worker/sync/ps_sync.h"

namespace gridsync {

PsSync::PsSync(const RunSpec& spec, HashGridModel* model, PsSession session,
               const BatchSource* source, const SplitSchedule* split, ThreadPool* pool,
               const WorkerOptions&)
    : PsSessionSync(spec, model, std::move(session)),
      source_(source),
      split_(split),
      pool_(pool),
      steps_(static_cast<uint64_t>(spec.config.training.steps)),
      row_set_(model->layout()) {
  touched_.resize(model->layout().n_levels());
}

void PsSync::PrepareBatch(uint64_t step) {
  if (batch_step_ == step) return;
  batch_step_ = step;
  Prepared& p = prepared_;
  const BatchSplit& split = split_->At(step);
  const int rank = static_cast<int>(rank_);
  source_->Fill(step, split.begin(rank), split.count(rank), &p.batch);
  const auto& layout = model_->layout();
  const uint32_t levels = layout.n_levels();
  cpu::HashGridLookup(layout, p.batch.positions.data(), p.batch.count, model_->ActiveLevels(step),
                      &p.lookup, pool_);
  row_set_.Assign(p.lookup, pool_);
  p.pulls.clear();
  for (uint32_t l = 0; l < levels; ++l) {
    const auto& rows = row_set_.rows(l);
    if (rows.empty()) continue;
    p.pulls.push_back(
        {l, false, rows.data(), rows.size(),
         model_->grid_params().data() + layout.level(l).row_offset * layout.features()});
  }
  for (size_t i = 0; i < model_->mlp_weights().size(); ++i) {
    p.pulls.push_back(
        {levels + static_cast<uint32_t>(i), true, nullptr, 0, model_->mlp_weights()[i].data()});
  }
}

Status PsSync::SendPrepare(uint64_t step) {
  PrepareBatch(step);
  Prepared& p = prepared_;
  GRIDSYNC_RETURN_IF_ERROR(
      session_.ps->SendPull(MinVersionFor(config_.ps, step), p.pulls, /*whole=*/false, step));
  // Read while the shards answer; ReceivePull adds them as it copies.
  session_.ps->GatherPendingUpdates();
  return Status::OK();
}

Result<const StepBatch*> PsSync::Prepare(uint64_t step) {
  if (!sent_first_) {
    GRIDSYNC_RETURN_IF_ERROR(SendPrepare(step));
    sent_first_ = true;
  }
  Prepared& p = prepared_;
  uint64_t version = received_version_;
  if (!received_) {
    GRIDSYNC_ASSIGN_OR_RETURN(version, session_.ps->ReceivePull());
  }
  // ReceivePull added this worker's pending updates to the pulled rows
  // (GatherPendingUpdates in SendPrepare).
  received_ = false;
  // The pulled rows are the fp32 masters; the forward pass reads fp16.
  for (const auto& ref : p.pulls) {
    if (ref.table < model_->layout().n_levels())
      model_->RefreshWorkingCopy(ref.table, ref.rows, ref.row_count);
  }
  model_->RefreshMlpWorkingCopy();
  read_version_ = version;
  if (config_.ps.consistency != Consistency::kAsync) {
    // Steps of pushes (anyone's) the parameters this step reads lack.
    RecordStaleness(step > version ? step - version : 0);
  }
  return &p.batch;
}

Result<HashGridModel*> PsSync::Snapshot(uint64_t done) {
  // The pull Apply sent for the next step is received first (one pull at a
  // time per client); Prepare then takes it as it would have.
  if (sent_first_ && done < steps_ && !received_) {
    GRIDSYNC_ASSIGN_OR_RETURN(received_version_, session_.ps->ReceivePull());
    received_ = true;
  }
  return PsSessionSync::Snapshot(done);
}

Result<uint64_t> PsSync::Recover(const Status& failure) {
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t step, FollowRollback(failure));
  // What was prepared or pulled belongs to the abandoned history.
  sent_first_ = false;
  received_ = false;
  batch_step_.reset();
  return step;
}

Result<SyncOutcome> PsSync::Apply(uint64_t step, ModelGradients* grads, float loss_scale) {
  const bool mixed = config_.training.mixed_precision;
  const uint32_t levels = model_->layout().n_levels();
  SyncOutcome outcome;
  // The grid's values may be on the model's device (see ModelGradients).
  const bool on_device = grads->grid_on_device;
  outcome.finite = TakeGradients(grads, mixed, &touched_, pool_) && grads->grid_fits;
  if (!outcome.finite) {
    for (auto& m : grads->mlp) m.setZero();
    GRIDSYNC_RETURN_IF_ERROR(session_.ps->PushSkipped(step));
  } else {
    // The shards (or the worker's Adam) take true gradients: unscale the
    // fp16-rounded values (exact: the scale is a power of two).
    const float unscale = 1.0f / loss_scale;
    std::vector<TableRowsRef> push;
    for (uint32_t l = 0; l < levels; ++l) {
      SparseRows& rows = touched_[l];
      outcome.grid_rows += rows.size();
      if (rows.size() == 0) continue;
      if (on_device) {
        push.push_back({l, false, rows.rows.data(), rows.size(), nullptr, /*on_device=*/true});
        continue;
      }
      if (unscale != 1.0f) {
        for (float& v : rows.values) v *= unscale;
      }
      // The client may take the vectors (zero copy); TakeGradients refills
      // them next step.
      push.push_back({l, false, rows.rows.data(), rows.size(), rows.values.data(), false,
                      &rows.rows, &rows.values});
    }
    for (size_t i = 0; i < grads->mlp.size(); ++i) {
      if (unscale != 1.0f) grads->mlp[i] *= unscale;
      push.push_back({levels + static_cast<uint32_t>(i), true, nullptr, 0, grads->mlp[i].data()});
    }
    // A push carries each row's full width, so dense rows travel values-only
    // per shard; SplitAll re-packs them per owner.
    // The next step's batch needs neither the acks nor the parameters.
    const bool next = step + 1 < steps_;
    GRIDSYNC_RETURN_IF_ERROR(session_.ps->Push(
        wire::Kind::kPush, step, push,
        next ? [this, step] { PrepareBatch(step + 1); } : std::function<void()>()));
    for (auto& m : grads->mlp) m.setZero();
  }
  // With the shards' partitions at this step, the whole training state.
  GRIDSYNC_RETURN_IF_ERROR(CheckpointIfDue(step));
  if (config_.ps.consistency == Consistency::kAsync) {
    // Versions count single pushes here: staleness is the number of other
    // workers' pushes applied between this step's read and its own push.
    const uint64_t ack = session_.ps->last_ack_version();
    const uint64_t others = ack > read_version_ + 1 ? ack - read_version_ - 1 : 0;
    RecordStaleness(others);
  }
  // The next step's pull goes out right after this push: the shards answer
  // it (bsp: once every worker's push of this step is in; ssp, async: at
  // once, within the bound) while this worker samples nothing else.
  if (step + 1 < steps_) GRIDSYNC_RETURN_IF_ERROR(SendPrepare(step + 1));
  return outcome;
}

}  // namespace gridsync
