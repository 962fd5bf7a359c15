// PsClient's training state (ps_client.h): the error-feedback residuals and
// worker Adam's state, kept here or, for the tables a DevicePushSource
// owns, on the model's device and copied both ways; pending updates; the
// final flush; checkpoints.
//
// Thread safety: see ps_client.h.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "common/counter_rng.h"
#include "common/state_bytes.h"
#include "worker/ps_client.h"
#include "worker/ps_client_internal.h"
#include "worker/worker_adam.h"

namespace gridsync {

using ps_internal::Clock;
using ps_internal::FeedbackKey;
using ps_internal::ScopedSeconds;
using ps_internal::Seconds;
using ps_internal::SplitAll;

void PsClient::GatherPendingUpdates() {
  for (auto& at : pull_pending_at_) at.clear();
  if (!adds_pending_updates() || pull_request_ == 0 || pull_evaluation_) return;
  // Each piece writes only its own values of its shard's buffer. Sparse
  // blocks go in slices of rows: a grid's finest levels hold most of the
  // rows, and whole blocks left one thread alone with the last of them.
  constexpr uint32_t kSliceRows = 8192;
  struct Piece {
    uint64_t key;
    const wire::OutBlock* block;
    uint32_t begin, end;
    float* out;
  };
  std::vector<Piece> pieces;
  for (uint32_t s = 0; s < pull_blocks_.size(); ++s) {
    const auto& blocks = pull_blocks_[s];
    auto& at = pull_pending_at_[s];
    at.assign(blocks.size(), PendingBlock{});
    size_t total = 0;
    for (size_t b = 0; b < blocks.size(); ++b) {
      const uint64_t key = FeedbackKey(blocks[b].table, blocks[b].col_begin);
      // A device's tables get theirs where the rows are read (see the header).
      if (DeviceOwned(key)) continue;
      at[b] = {total, feedback_.VersionOf(key), feedback_.Entries(key) != 0};
      total += size_t{blocks[b].row_count} * blocks[b].width;
    }
    // Kept from pull to pull: growing it once, not every step, faults in
    // its pages once.
    if (pull_pending_[s].size() < total) pull_pending_[s].resize(total);
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (!at[b].gathered) continue;
      const wire::OutBlock& block = blocks[b];
      const uint64_t key = FeedbackKey(block.table, block.col_begin);
      for (uint32_t begin = 0; begin < block.row_count; begin += kSliceRows) {
        pieces.push_back({key, &block, begin, std::min(block.row_count, begin + kSliceRows),
                          pull_pending_[s].data() + at[b].at + size_t{begin} * block.width});
      }
    }
  }
  auto gather = [&](size_t i) {
    const Piece& p = pieces[i];
    const wire::OutBlock& block = *p.block;
    const uint32_t* rows = block.dense ? nullptr : block.rows.data() + p.begin;
    feedback_.GatherResiduals(p.key, rows, block.row_begin + p.begin, p.end - p.begin, block.width,
                              p.out);
  };
  ParallelForOn(pool_, pieces.size(), gather);
}

const float* PsClient::PendingUpdate(uint32_t table, uint32_t col_begin, uint32_t row) const {
  return feedback_.Residual(FeedbackKey(table, col_begin), row);
}

Status PsClient::SetDevicePushSource(DevicePushSource* source,
                                     const std::vector<uint32_t>& tables) {
  for (uint32_t t : tables) {
    if (t >= partition_.n_tables())
      return Status::InvalidArgument("device push table " + std::to_string(t) +
                                     "; allowed: below " + std::to_string(partition_.n_tables()));
  }
  if (device_source_ != nullptr) {
    GRIDSYNC_RETURN_IF_ERROR(SyncFeedback());
    GRIDSYNC_RETURN_IF_ERROR(SyncAdamState());
  }
  device_source_ = source;
  device_tables_.assign(partition_.n_tables(), false);
  if (source == nullptr) return Status::OK();
  for (uint32_t t : tables) device_tables_[t] = true;
  return LoadDeviceState();
}

Status PsClient::LoadDeviceState() {
  cpu::ErrorFeedback owned;
  for (uint64_t key : feedback_.Keys())
    if (DeviceOwned(key)) owned.CopyTableFrom(feedback_, key);
  GRIDSYNC_RETURN_IF_ERROR(
      device_source_->LoadResiduals(owned).WithContext("loading the residuals onto the device"));
  if (worker_adam_ == nullptr) return Status::OK();
  for (uint32_t t = 0; t < device_tables_.size(); ++t) {
    if (!device_tables_[t]) continue;
    const cpu::AdamTable* state = worker_adam_->HasState(t) ? worker_adam_->State(t) : nullptr;
    GRIDSYNC_RETURN_IF_ERROR(device_source_->LoadAdamState(t, state).WithContext(
        "loading table " + std::to_string(t) + "'s Adam state onto the device"));
  }
  return Status::OK();
}

Status PsClient::SyncAdamState() {
  if (device_source_ == nullptr || worker_adam_ == nullptr) return Status::OK();
  for (uint32_t t = 0; t < device_tables_.size(); ++t) {
    if (!device_tables_[t] || !worker_adam_->HasState(t)) continue;
    GRIDSYNC_RETURN_IF_ERROR(
        device_source_->CopyAdamState(t, worker_adam_->State(t))
            .WithContext("copying table " + std::to_string(t) + "'s Adam state from the device"));
  }
  return Status::OK();
}

Status PsClient::SyncFeedback() {
  if (device_source_ == nullptr) return Status::OK();
  cpu::ErrorFeedback held;
  GRIDSYNC_RETURN_IF_ERROR(device_source_->CopyResidualsTo(&held).WithContext(
      "copying the residuals from the model's device"));
  for (uint64_t key : feedback_.Keys())
    if (DeviceOwned(key)) feedback_.Erase(key);
  for (uint64_t key : held.Keys()) {
    if (!DeviceOwned(key))
      return Status::Internal("the device holds residuals of table " + std::to_string(key >> 32) +
                              ", which it does not push");
    feedback_.CopyTableFrom(held, key);
  }
  return Status::OK();
}

Result<bool> PsClient::FlushResiduals(uint64_t step, uint64_t min_version) {
  if (!use_feedback_) return false;
  GRIDSYNC_RETURN_IF_ERROR(SyncFeedback());
  // Under bsp a shard refuses a push for a step it has not reached.
  GRIDSYNC_RETURN_IF_ERROR(SendPull(min_version, {}));
  GRIDSYNC_RETURN_IF_ERROR(
      ReceivePull().status().WithContext("waiting to flush the error-feedback residuals"));
  struct Rows {
    std::vector<uint32_t> rows;
    std::vector<float> values;
  };
  std::vector<Rows> held(partition_.n_tables());
  std::vector<TableRowsRef> refs;
  for (uint32_t t = 0; t < partition_.n_tables(); ++t) {
    const uint32_t width = partition_.table(t).width;
    const uint32_t cw = partition_.ColWidth(t);
    Rows& h = held[t];
    for (uint32_t g = 0; g < partition_.ColumnGroups(t); ++g) {
      const auto rows = feedback_.Rows(FeedbackKey(t, partition_.ColBegin(t, g)));
      h.rows.insert(h.rows.end(), rows.begin(), rows.end());
    }
    std::sort(h.rows.begin(), h.rows.end());
    h.rows.erase(std::unique(h.rows.begin(), h.rows.end()), h.rows.end());
    if (h.rows.empty()) continue;
    h.values.assign(h.rows.size() * width, 0.0f);
    for (uint32_t g = 0; g < partition_.ColumnGroups(t); ++g) {
      const uint32_t col = partition_.ColBegin(t, g);
      for (size_t i = 0; i < h.rows.size(); ++i) {
        const float* r = feedback_.Residual(FeedbackKey(t, col), h.rows[i]);
        if (r != nullptr) std::memcpy(h.values.data() + i * width + col, r, cw * sizeof(float));
      }
    }
    refs.push_back({t, false, h.rows.data(), h.rows.size(), h.values.data()});
  }
  feedback_.Clear();
  if (device_source_ != nullptr) {
    const cpu::ErrorFeedback none;
    GRIDSYNC_RETURN_IF_ERROR(device_source_->LoadResiduals(none));
  }
  // What was computed already: no optimizer, no codec.
  const auto start = Clock::now();
  const Status status =
      SendAndAwaitAcks(wire::Kind::kPush, step, SplitAll(partition_, refs, /*with_values=*/true));
  counters_.push_seconds += Seconds(start);
  GRIDSYNC_RETURN_IF_ERROR(status.WithContext("flushing the error-feedback residuals"));
  return true;
}

Status PsClient::AppendState(std::string* out) {
  GRIDSYNC_RETURN_IF_ERROR(SyncFeedback());
  GRIDSYNC_RETURN_IF_ERROR(SyncAdamState());
  // The first byte's bits: 1, Adam on the worker; 2, delta pulls' replicas.
  out->push_back(
      static_cast<char>((worker_adam_ ? kStateAdam : 0) | (delta_pulls_ ? kStateReplicas : 0)));
  feedback_.AppendState(out);
  if (worker_adam_) worker_adam_->AppendState(out);
  if (delta_pulls_) {
    // Per table: whether it was pulled yet (its replica starts at its first
    // pull), then its rows x width values. The shards keep their copies in
    // theirs (ShardStore::AppendState), written after the same pulls.
    for (uint32_t t = 0; t < partition_.n_tables(); ++t) {
      const bool held = t < replica_.size() && !replica_[t].empty();
      out->push_back(held ? '\1' : '\0');
      if (held) AppendArray(out, replica_[t]);
    }
  }
  return Status::OK();
}

Status PsClient::RestoreState(std::string_view data, uint64_t step) {
  const uint8_t flags = data.empty() ? 0xff : static_cast<uint8_t>(data.front());
  if ((flags & ~(kStateAdam | kStateReplicas)) != 0)
    return Status::Corruption("not a worker state (no valid flags byte)");
  const bool adam = (flags & kStateAdam) != 0;
  if (adam != (worker_adam_ != nullptr)) {
    return Status::InvalidArgument(std::string("the state was saved with Adam on the ") +
                                   (adam ? "worker" : "shards") + ", this run has it on the " +
                                   (worker_adam_ ? "worker" : "shards") +
                                   "; allowed: the same ps.optimizer and compression.codec");
  }
  const bool replicas = (flags & kStateReplicas) != 0;
  if (replicas != delta_pulls_) {
    return Status::InvalidArgument(
        std::string("the state was saved ") + (replicas ? "with" : "without") +
        " delta pulls' replicas, this run has " + (delta_pulls_ ? "them" : "none") +
        "; allowed: the same compression.pull and compression.codec");
  }
  data.remove_prefix(1);
  // Every residual table must be a column slice this client pushes, rows
  // inside its table: a state of another model would otherwise meet the
  // first push's width check. Asked before the table is allocated, so that
  // a forged key or row sizes no memory.
  const auto admit = [this](uint64_t key, uint32_t width, uint32_t max_row) -> Status {
    const uint64_t t = key >> 32, col = key & 0xffffffffu;
    const bool slice = t < partition_.n_tables() &&
                       width == partition_.ColWidth(static_cast<uint32_t>(t)) && col % width == 0 &&
                       col / width < partition_.ColumnGroups(static_cast<uint32_t>(t));
    if (slice && max_row < partition_.table(static_cast<uint32_t>(t)).rows) return Status::OK();
    return Status::InvalidArgument(
        "the worker state holds residuals of table " + std::to_string(t) + ", columns [" +
        std::to_string(col) + ", +" + std::to_string(width) + ")" +
        (slice ? " with a row beyond the table" : "") +
        "; allowed: the column slices and rows of this run's tables (the same model, ps.shards "
        "and distributed.model_parallel)");
  };
  if (Status restored = feedback_.RestoreState(&data, admit); !restored.ok()) {
    feedback_.Clear();
    return restored;
  }
  if (worker_adam_) GRIDSYNC_RETURN_IF_ERROR(worker_adam_->RestoreState(&data, step));
  if (delta_pulls_) GRIDSYNC_RETURN_IF_ERROR(RestoreReplicas(&data));
  if (!data.empty())
    return Status::Corruption(std::to_string(data.size()) + " bytes beyond the worker's state");
  if (device_source_ != nullptr) return LoadDeviceState();
  return Status::OK();
}

Status PsClient::RestoreReplicas(std::string_view* data) {
  std::vector<std::vector<float>> restored(partition_.n_tables());
  const float bound = wire::Limits{}.max_abs_value;
  for (uint32_t t = 0; t < partition_.n_tables(); ++t) {
    if (data->empty() || static_cast<uint8_t>(data->front()) > 1)
      return Status::Corruption("the worker state's replica of table " + std::to_string(t) +
                                " has no valid presence byte");
    const bool held = data->front() == '\1';
    data->remove_prefix(1);
    if (!held) continue;
    const auto& info = partition_.table(t);
    // Sized by the partition, never by the bytes.
    if (!TakeArray(data, uint64_t{info.rows} * info.width, &restored[t])) {
      return Status::Corruption("the worker state's replica of table " + std::to_string(t) +
                                " is shorter than its " + std::to_string(info.rows) + " rows x " +
                                std::to_string(info.width) + " values");
    }
    const size_t at = wire::FirstOutOfBounds(restored[t], bound);
    if (at != restored[t].size()) {
      return Status::Corruption(
          "the worker state's replica of table " + std::to_string(t) + ": row " +
          std::to_string(at / info.width) + ", column " + std::to_string(at % info.width) + " is " +
          std::to_string(restored[t][at]) +
          "; allowed: finite values within the wire's bound (what pulls carry)");
    }
  }
  replica_ = std::move(restored);
  return Status::OK();
}

}  // namespace gridsync
