#include "worker/sync/hybrid_sync.h"

#include <bit>
#include <chrono>
#include <cstring>

#include "kernels/adam_math.h"
#include "kernels/cuda/device_trainer.h"
#include "worker/collective/factory.h"

namespace gridsync {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Row ids travel through float collectives bit for bit.
float BitsToFloat(uint32_t v) { return std::bit_cast<float>(v); }
uint32_t FloatToBits(float f) { return std::bit_cast<uint32_t>(f); }

// One row's values: grid rows are 2 or 4 floats, where a libc memcpy call
// per row (hundreds of thousands a step) cost more than the copy.
inline void CopyRow(float* dst, const float* src, uint32_t width) {
  switch (width) {
    case 2:
      dst[0] = src[0];
      dst[1] = src[1];
      return;
    case 4:
      dst[0] = src[0];
      dst[1] = src[1];
      dst[2] = src[2];
      dst[3] = src[3];
      return;
    default:
      std::memcpy(dst, src, width * sizeof(float));
  }
}

}  // namespace

HybridSync::HybridSync(const RunSpec& spec, HashGridModel* model, PsSession session,
                       const BatchSource* source, const SplitSchedule* split, ThreadPool* pool)
    : PsSessionSync(spec, model, std::move(session)),
      source_(source),
      split_(split),
      pool_(pool),
      space_(*model),
      row_set_(model->layout()) {}

Result<std::unique_ptr<HybridSync>> HybridSync::Create(const RunSpec& spec, HashGridModel* model,
                                                       PsSession session, const BatchSource* source,
                                                       const SplitSchedule* split, ThreadPool* pool,
                                                       const WorkerOptions& options,
                                                       std::string collective) {
  const auto& d = spec.config.distributed;
  std::unique_ptr<HybridSync> sync(
      new HybridSync(spec, model, std::move(session), source, split, pool));
  const int rank = static_cast<int>(sync->rank_);
  const auto nodes = d.ResolvedNodes();
  const int node = d.NodeOf(rank);
  sync->local_ = d.LocalRankOf(rank);
  sync->node_size_ = nodes[static_cast<size_t>(node)].workers;
  sync->node_name_ = nodes[static_cast<size_t>(node)].name;
  if (options.intra_group) {
    GRIDSYNC_ASSIGN_OR_RETURN(sync->intra_,
                              options.intra_group(node, sync->local_, sync->node_size_));
  } else {
    sync->store_ = std::make_unique<CoordinatorStore>(sync->session_.coordinator.get(),
                                                      kCollectiveStorePrefix);
    // NCCL (collective nccl) on the local rank's device, as the model's.
    sync->collective_ = std::move(collective);
    sync->endpoint_ = options.endpoint;
    if (const auto device = cuda::DeviceForLocalRank(sync->local_); device.ok())
      sync->endpoint_.cuda_device = *device;
    // A worker that rejoins a rolled-back job meets its node under the
    // job's current epoch.
    GRIDSYNC_RETURN_IF_ERROR(sync->JoinIntra(sync->session_.ps->epoch()));
  }
  const RowSpace& space = sync->space_;
  sync->bounds_ = space.SliceRows(sync->node_size_);
  sync->needed_bits_.resize((space.rows() + 63) / 64);
  return sync;
}

Status HybridSync::JoinIntra(uint32_t epoch) {
  std::string group = "intra-" + node_name_;
  if (epoch > 0) group += "-epoch" + std::to_string(epoch);
  GRIDSYNC_ASSIGN_OR_RETURN(owned_intra_,
                            MakeCollective(collective_, store_.get(), local_, node_size_, group,
                                           spec_.sync.timeout, endpoint_));
  intra_ = owned_intra_.get();
  return Status::OK();
}

Result<uint64_t> HybridSync::Recover(const Status& failure) {
  if (owned_intra_ == nullptr) {
    return failure.WithContext("no rollback with a node collective handed in by the caller");
  }
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t step, FollowRollback(failure));
  // The old group goes first: a node member still blocked in it fails at
  // once and follows the rollback too.
  intra_ = nullptr;
  owned_intra_.reset();
  GRIDSYNC_RETURN_IF_ERROR(JoinIntra(session_.ps->epoch())
                               .WithContext(me_ +
                                            " forming its node's collective again after "
                                            "the rollback to step " +
                                            std::to_string(step)));
  return step;
}

float* HybridSync::ParamOf(uint32_t t, uint64_t global_row) {
  const auto& tab = space_.tables()[t];
  const uint64_t row = global_row - tab.first_row;
  const uint32_t levels = model_->layout().n_levels();
  if (t < levels) {
    return model_->grid_params().data() +
           (model_->layout().level(t).row_offset + row) * model_->layout().features();
  }
  return model_->mlp_weights()[t - levels].data() + row * tab.width;
}

const float* HybridSync::GradientOf(const ModelGradients& grads, uint32_t t,
                                    uint64_t global_row) const {
  const auto& tab = space_.tables()[t];
  const uint32_t levels = model_->layout().n_levels();
  if (t < levels) return grads.grid.dense() + global_row * tab.width;  // grid rows lie end to end
  return grads.mlp[t - levels].data() + (global_row - tab.first_row) * tab.width;
}

Result<const StepBatch*> HybridSync::Prepare(uint64_t step) {
  const auto& layout = model_->layout();
  const uint32_t levels = layout.n_levels();
  const auto& tables = space_.tables();
  const BatchSplit& split = split_->At(step);
  const int rank = static_cast<int>(rank_);
  source_->Fill(step, split.begin(rank), split.count(rank), &batch_);
  cpu::HashGridLookup(layout, batch_.positions.data(), batch_.count, model_->ActiveLevels(step),
                      &lookup_, pool_);
  row_set_.Assign(lookup_, pool_);

  // The node's union of rows to read next, and its fresh values.
  const auto start = Clock::now();
  std::vector<float> mine;
  for (uint32_t l = 0; l < levels; ++l) {
    const uint64_t first = tables[l].first_row;
    for (uint32_t row : row_set_.rows(l))
      mine.push_back(BitsToFloat(static_cast<uint32_t>(first + row)));
  }
  const float my_count = static_cast<float>(mine.size());
  std::vector<float> counts_f(static_cast<size_t>(node_size_));
  GRIDSYNC_RETURN_IF_ERROR(intra_->AllGather(&my_count, 1, counts_f.data()));
  std::vector<size_t> counts(counts_f.begin(), counts_f.end());
  size_t total_ids = 0;
  for (size_t c : counts) total_ids += c;
  std::vector<float> all_ids(total_ids);
  GRIDSYNC_RETURN_IF_ERROR(intra_->AllGatherV(mine.data(), counts, all_ids.data()));
  std::fill(needed_bits_.begin(), needed_bits_.end(), 0);
  for (float f : all_ids) {
    const uint64_t g = FloatToBits(f);
    needed_bits_[g >> 6] |= uint64_t{1} << (g & 63);
  }
  for (size_t ti = levels; ti < tables.size(); ++ti) {  // MLP rows: always read
    for (uint64_t g = tables[ti].first_row; g < tables[ti].first_row + tables[ti].rows; ++g)
      needed_bits_[g >> 6] |= uint64_t{1} << (g & 63);
  }
  // Per local rank, the needed rows inside its slice (ascending): what
  // this step's pulls, all-gather and reduce-scatter carry.
  auto& slice_rows = slice_rows_;
  slice_rows.assign(static_cast<size_t>(node_size_), {});
  const uint64_t grid_rows = layout.total_rows();
  node_grid_rows_.clear();
  node_grid_begin_.assign(1, 0);
  for (int l = 0; l < node_size_; ++l) {
    const uint64_t begin = bounds_[static_cast<size_t>(l)];
    const uint64_t end = bounds_[static_cast<size_t>(l) + 1];
    // Word by word, only the set bits (a step needs a sixth of the rows or
    // fewer; testing every row's bit was a few ms a step).
    for (uint64_t word = begin >> 6; word < (end + 63) >> 6; ++word) {
      uint64_t bits = needed_bits_[word];
      while (bits != 0) {
        const uint64_t g = (word << 6) + static_cast<uint64_t>(std::countr_zero(bits));
        bits &= bits - 1;
        if (g < begin) continue;
        if (g >= end) break;
        slice_rows[static_cast<size_t>(l)].push_back(g);
        if (g < grid_rows) node_grid_rows_.push_back(static_cast<uint32_t>(g));
      }
    }
    node_grid_begin_.push_back(node_grid_rows_.size());
  }
  // Pull mine, per table.
  std::vector<std::vector<uint32_t>> pull_rows(tables.size());
  RowSpace::Cursor pull_cursor(space_);
  for (uint64_t g : slice_rows[static_cast<size_t>(local_)]) {
    const uint32_t ti = pull_cursor.TableOf(g);
    pull_rows[ti].push_back(static_cast<uint32_t>(g - tables[ti].first_row));
  }
  std::vector<TablePullRef> pulls;
  for (uint32_t ti = 0; ti < pull_rows.size(); ++ti) {
    if (pull_rows[ti].empty()) continue;
    float* dest =
        ti < levels ? model_->grid_params().data() + layout.level(ti).row_offset * layout.features()
                    : model_->mlp_weights()[ti - levels].data();
    pulls.push_back({ti, false, pull_rows[ti].data(), pull_rows[ti].size(), dest});
  }
  GRIDSYNC_RETURN_IF_ERROR(
      session_.ps->SendPull(MinVersionFor(config_.ps, step), pulls, /*whole=*/false, step));
  session_.ps->GatherPendingUpdates();  // added as the rows come in, before the node shares them
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t version, session_.ps->ReceivePull());
  if (config_.ps.consistency != Consistency::kAsync)
    RecordStaleness(step > version ? step - version : 0);
  // Share the pulled values inside the node.
  auto& value_counts = value_counts_;
  value_counts.assign(static_cast<size_t>(node_size_), 0);
  for (int l = 0; l < node_size_; ++l) {
    size_t n = 0;
    RowSpace::Cursor cursor(space_);
    for (uint64_t g : slice_rows[static_cast<size_t>(l)]) n += tables[cursor.TableOf(g)].width;
    value_counts[static_cast<size_t>(l)] = n;
  }
  std::vector<float> my_values(value_counts[static_cast<size_t>(local_)]);
  RowSpace::Cursor mine_cursor(space_);
  size_t mine_at = 0;
  for (uint64_t g : slice_rows[static_cast<size_t>(local_)]) {
    const uint32_t ti = mine_cursor.TableOf(g);
    CopyRow(my_values.data() + mine_at, ParamOf(ti, g), tables[ti].width);
    mine_at += tables[ti].width;
  }
  if (device_ != nullptr && session_.ps->adds_pending_updates())
    GRIDSYNC_RETURN_IF_ERROR(AddDevicePendingUpdates(my_values.data()));
  size_t total_values = 0;
  for (size_t c : value_counts) total_values += c;
  std::vector<float> all_values(total_values);
  GRIDSYNC_RETURN_IF_ERROR(intra_->AllGatherV(my_values.data(), value_counts, all_values.data()));
  size_t at = 0;
  RowSpace::Cursor all_cursor(space_);  // the slices lie in ascending order
  for (int l = 0; l < node_size_; ++l) {
    for (uint64_t g : slice_rows[static_cast<size_t>(l)]) {
      const uint32_t ti = all_cursor.TableOf(g);
      const uint32_t w = tables[ti].width;
      CopyRow(ParamOf(ti, g), all_values.data() + at, w);
      at += w;
      if (ti < levels) {
        const auto row = static_cast<uint32_t>(g - tables[ti].first_row);
        model_->RefreshWorkingCopy(ti, &row, 1);
      }
    }
  }
  model_->RefreshMlpWorkingCopy();
  comm_seconds_ += Since(start);
  return &batch_;
}

Status HybridSync::AddDevicePendingUpdates(float* values) {
  const auto l = static_cast<size_t>(local_);
  const uint32_t* rows = node_grid_rows_.data() + node_grid_begin_[l];
  const size_t n = node_grid_begin_[l + 1] - node_grid_begin_[l];
  if (n == 0) return Status::OK();
  // The slice's grid rows come first in `values` (they precede the MLP's).
  GRIDSYNC_RETURN_IF_ERROR(device_->UploadGridRows(rows, n, values));
  GRIDSYNC_RETURN_IF_ERROR(device_->AddResidualsToGridRows(rows, n));
  return device_->DownloadGridRows(rows, n, values);
}

Result<bool> HybridSync::SumOnTheDevice(bool mixed, std::vector<float>* mlp_values) {
  const auto l = static_cast<size_t>(local_);
  const uint32_t F = model_->layout().features();
  // A collective that reads host memory gets the trainer's pinned copies.
  const bool host = !intra_->enqueues_on_device();
  GRIDSYNC_ASSIGN_OR_RETURN(
      const cuda::DeviceTrainer::NodeExchange exchange,
      device_->PackNodeGradients(node_grid_rows_.data(), node_grid_rows_.size(), value_counts_[l],
                                 mixed, host));
  size_t total = 0;
  for (size_t c : value_counts_) total += c;
  if (exchange.packed_floats != total) {
    return Status::Internal(me_ + ": the trainer packed " + std::to_string(exchange.packed_floats) +
                            " floats for the node's sum; the slices hold " + std::to_string(total));
  }
  if (mixed) {
    float overflow = exchange.fits ? 0.0f : 1.0f;
    GRIDSYNC_RETURN_IF_ERROR(intra_->AllReduceSum(&overflow, 1));
    if (overflow != 0.0f) return false;
  }
  GRIDSYNC_RETURN_IF_ERROR(
      intra_->ReduceScatterSum(exchange.packed, exchange.slice, value_counts_));
  const size_t mine = node_grid_begin_[l + 1] - node_grid_begin_[l];
  mlp_values->resize(value_counts_[l] - mine * F);
  GRIDSYNC_RETURN_IF_ERROR(device_->UnpackNodeSlice(node_grid_rows_.data() + node_grid_begin_[l],
                                                    mine, mlp_values->data(), mlp_values->size()));
  return true;
}

Status HybridSync::PushSlice(uint64_t step, std::span<const uint64_t> rows, float* values,
                             float unscale, std::vector<TableRowsRef> push) {
  const auto& tables = space_.tables();
  std::vector<std::vector<uint32_t>> push_rows(tables.size());
  std::vector<std::vector<float>> push_values(tables.size());
  size_t element = 0;
  RowSpace::Cursor cursor(space_);
  for (uint64_t g : rows) {
    const uint32_t ti = cursor.TableOf(g);
    const uint32_t w = tables[ti].width;
    float* v = values + element;
    element += w;
    if (!RowHasGradient(v, w)) continue;
    if (unscale != 1.0f) {
      for (uint32_t f = 0; f < w; ++f) v[f] *= unscale;
    }
    push_rows[ti].push_back(static_cast<uint32_t>(g - tables[ti].first_row));
    push_values[ti].insert(push_values[ti].end(), v, v + w);
  }
  for (uint32_t ti = 0; ti < push_rows.size(); ++ti) {
    if (push_rows[ti].empty()) continue;
    push.push_back({ti, false, push_rows[ti].data(), push_rows[ti].size(), push_values[ti].data()});
  }
  return session_.ps->Push(wire::Kind::kPush, step, push);
}

Result<SyncOutcome> HybridSync::Apply(uint64_t step, ModelGradients* grads, float loss_scale) {
  const auto& layout = model_->layout();
  const bool mixed = config_.training.mixed_precision;
  const auto l = static_cast<size_t>(local_);
  const std::span<const uint64_t> my_rows = slice_rows_[l];
  SyncOutcome outcome;
  for (uint32_t level = 0; level < layout.n_levels(); ++level)
    outcome.grid_rows += grads->grid.TouchedRows(level);
  const auto start = Clock::now();
  const float unscale = 1.0f / loss_scale;
  if (grads->sums_on_device) {
    if (device_ == nullptr)
      return Status::Internal(me_ + ": gradients on the device, and no trainer to sum them");
    grads->Clear(pool_);  // marks only
    std::vector<float> mlp_values;
    GRIDSYNC_ASSIGN_OR_RETURN(outcome.finite, SumOnTheDevice(mixed, &mlp_values));
    if (!outcome.finite) {
      GRIDSYNC_RETURN_IF_ERROR(session_.ps->PushSkipped(step));
    } else {
      // The slice's grid rows stay on the device: those with a gradient
      // are unscaled there and pushed as on_device refs, encoded there.
      const uint32_t* rows = node_grid_rows_.data() + node_grid_begin_[l];
      const size_t n = node_grid_begin_[l + 1] - node_grid_begin_[l];
      std::vector<uint8_t> has(n);
      Status pushed = device_->GridRowsWithGradient(rows, n, has.data());
      std::vector<uint32_t> kept;
      for (size_t i = 0; i < n; ++i) {
        if (has[i]) kept.push_back(rows[i]);
      }
      std::vector<std::vector<uint32_t>> local(layout.n_levels());
      RowSpace::Cursor cursor(space_);
      for (uint32_t g : kept) {
        const uint32_t t = cursor.TableOf(g);
        local[t].push_back(static_cast<uint32_t>(g - space_.tables()[t].first_row));
      }
      if (pushed.ok())
        pushed = device_->PrepareGridPush(kept.data(), kept.size(), false, unscale).status();
      std::vector<TableRowsRef> push;
      for (uint32_t t = 0; t < local.size(); ++t) {
        if (!local[t].empty())
          push.push_back({t, false, local[t].data(), local[t].size(), nullptr, /*on_device=*/true});
      }
      if (pushed.ok())
        pushed = PushSlice(step, my_rows.subspan(n), mlp_values.data(), unscale, std::move(push));
      // Encoded (or failed: the step is computed again from zero).
      const Status zeroed = device_->ZeroGridGradientRows(rows, n);
      GRIDSYNC_RETURN_IF_ERROR(pushed);
      GRIDSYNC_RETURN_IF_ERROR(zeroed);
    }
  } else {
    // Reduce-scatter inside the node: local rank l gets its slice's sum.
    size_t total = 0;
    for (size_t c : value_counts_) total += c;
    packed_.resize(total);
    size_t at = 0;
    RowSpace::Cursor cursor(space_);  // the slices lie in ascending order
    for (const auto& rows : slice_rows_) {
      for (uint64_t g : rows) {
        const uint32_t t = cursor.TableOf(g);
        const uint32_t w = space_.tables()[t].width;
        CopyRow(packed_.data() + at, GradientOf(*grads, t, g), w);
        at += w;
      }
    }
    grads->Clear(pool_);
    if (mixed) {
      float overflow = RoundToHalfChecked(packed_.data(), packed_.size()) ? 0.0f : 1.0f;
      GRIDSYNC_RETURN_IF_ERROR(intra_->AllReduceSum(&overflow, 1));
      outcome.finite = overflow == 0.0f;
    }
    if (!outcome.finite) {
      GRIDSYNC_RETURN_IF_ERROR(session_.ps->PushSkipped(step));
    } else {
      my_grad_.resize(value_counts_[l]);
      GRIDSYNC_RETURN_IF_ERROR(
          intra_->ReduceScatterSum(packed_.data(), my_grad_.data(), value_counts_));
      // Push the slice's non-zero rows, unscaled.
      GRIDSYNC_RETURN_IF_ERROR(PushSlice(step, my_rows, my_grad_.data(), unscale, {}));
    }
  }
  comm_seconds_ += Since(start);
  // With the shards' partitions at this step, the whole training state.
  GRIDSYNC_RETURN_IF_ERROR(CheckpointIfDue(step));
  return outcome;
}

}  // namespace gridsync
