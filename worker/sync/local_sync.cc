#include "worker/sync/local_sync.h"

namespace gridsync {

LocalSync::LocalSync(const RunSpec& spec, HashGridModel* model, const BatchSource* source,
                     ThreadPool* pool)
    : config_(spec.config), source_(source), pool_(pool), optimizer_(model, spec.model.adam) {
  rows_.resize(model->layout().n_levels());
}

Result<const StepBatch*> LocalSync::Prepare(uint64_t step) {
  source_->Fill(step, 0, static_cast<uint64_t>(config_.training.batch_size), &batch_);
  return &batch_;
}

Result<SyncOutcome> LocalSync::Apply(uint64_t, ModelGradients* grads, float loss_scale) {
  SyncOutcome outcome;
  if (!config_.training.mixed_precision && loss_scale == 1.0f) {
    // fp32: Adam straight from the gradient buffer (no overflow to check
    // first, so nothing needs taking out of it).
    outcome.grid_rows = optimizer_.ApplyTouched(grads, pool_);
    return outcome;
  }
  outcome.finite = TakeGradients(grads, config_.training.mixed_precision, &rows_, pool_);
  if (!outcome.finite) {
    for (auto& m : grads->mlp) m.setZero();  // the grid's were taken
    return outcome;
  }
  outcome.grid_rows = optimizer_.ApplyRows(rows_, &grads->mlp, 1.0f / loss_scale, pool_);
  return outcome;
}

}  // namespace gridsync
