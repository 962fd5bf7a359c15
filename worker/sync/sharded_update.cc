#include "worker/sync/sharded_update.h"

#include <algorithm>
#include <cstring>

#include "worker/params_file.h"

namespace gridsync {

Result<ShardedUpdate> ShardedUpdate::Make(const RunSpec& spec, const HashGridModel& model, int rank,
                                          int workers) {
  const auto& tables = spec.model.tables;
  GRIDSYNC_ASSIGN_OR_RETURN(
      Partition partition,
      Partition::Make(tables, static_cast<uint32_t>(workers), spec.sync.partition_dim));
  const RowSpace space(model);
  ShardedUpdate u;
  u.rank_ = rank;
  u.hyper_ = spec.model.adam;
  u.runs_.resize(static_cast<size_t>(workers));
  u.counts_.assign(static_cast<size_t>(workers), 0);
  u.tables_.resize(tables.size());
  const uint32_t levels = model.layout().n_levels();
  for (uint32_t t = 0; t < tables.size(); ++t) {
    const auto& info = space.tables()[t];
    const uint32_t groups = partition.ColumnGroups(t);
    const uint32_t cw = partition.ColWidth(t);
    // Runs merge within a table only: tables are separate tensors in the model.
    std::vector<size_t> table_start(u.runs_.size());
    for (size_t w = 0; w < u.runs_.size(); ++w) table_start[w] = u.runs_[w].size();
    LocalTable& local = u.tables_[t];
    local.offset = u.counts_[static_cast<size_t>(rank)];
    local.width = cw;
    local.sparse = t < levels;
    for (uint32_t row = 0; row < info.rows; ++row) {
      for (uint32_t g = 0; g < groups; ++g) {
        const uint32_t owner = partition.Owner(t, row, g);
        auto& runs = u.runs_[owner];
        const uint64_t at =
            info.first_element + uint64_t{row} * info.width + partition.ColBegin(t, g);
        if (runs.size() > table_start[owner] &&
            runs.back().flat_offset + runs.back().length == at && runs.back().length < (1u << 30)) {
          runs.back().length += cw;
        } else {
          runs.push_back({at, cw});
        }
        u.counts_[owner] += cw;
        if (owner == static_cast<uint32_t>(rank)) ++local.rows;
      }
    }
    local.adam.Resize(local.rows, cw);
    if (u.identity_.size() < local.rows) {
      const size_t from = u.identity_.size();
      u.identity_.resize(local.rows);
      for (size_t i = from; i < local.rows; ++i) u.identity_[i] = static_cast<uint32_t>(i);
    }
  }
  u.packed_.resize(space.elements());
  // Flat offsets where the model's tensors start: the grid, then each MLP matrix.
  uint64_t next = model.grid_params().size();
  u.tensor_starts_ = {0};
  for (const auto& m : model.mlp_weights()) {
    u.tensor_starts_.push_back(next);
    next += static_cast<uint64_t>(m.size());
  }
  u.grad_.resize(u.counts_[static_cast<size_t>(rank)]);
  // Every worker starts from the same seeded model: its slice of it.
  u.SliceParams(model);
  return u;
}

void ShardedUpdate::SliceParams(const HashGridModel& model) {
  const std::vector<float> flat = FlattenParams(model);
  params_.clear();
  for (const Run& run : runs_[static_cast<size_t>(rank_)]) {
    params_.insert(params_.end(), flat.begin() + static_cast<std::ptrdiff_t>(run.flat_offset),
                   flat.begin() + static_cast<std::ptrdiff_t>(run.flat_offset + run.length));
  }
}

Status ShardedUpdate::Step(Collective& flat_group, bool summed, float grad_scale,
                           std::vector<float>* flat, HashGridModel* model) {
  const auto me = static_cast<size_t>(rank_);
  if (summed) {
    size_t at = 0;
    for (const Run& run : runs_[me]) {
      std::memcpy(grad_.data() + at, flat->data() + run.flat_offset, run.length * sizeof(float));
      at += run.length;
    }
  } else {
    size_t at = 0;
    for (const auto& runs : runs_) {
      for (const Run& run : runs) {
        std::memcpy(packed_.data() + at, flat->data() + run.flat_offset,
                    run.length * sizeof(float));
        at += run.length;
      }
    }
    GRIDSYNC_RETURN_IF_ERROR(flat_group.ReduceScatterSum(packed_.data(), grad_.data(), counts_));
  }
  std::fill(flat->begin(), flat->end(), 0.0f);
  if (grad_scale != 1.0f) {
    for (float& g : grad_) g *= grad_scale;  // the product Adam would form
  }
  for (LocalTable& t : tables_) {
    if (t.rows == 0) continue;
    cpu::AdamUpdateIndexed(hyper_, identity_.data(), t.rows, grad_.data() + t.offset,
                           params_.data() + t.offset, &t.adam, t.sparse);
  }
  GRIDSYNC_RETURN_IF_ERROR(flat_group.AllGatherV(params_.data(), counts_, packed_.data()));
  // Back into the model: grid, then the MLP matrices, in flat order.
  std::vector<float*> bases = {model->grid_params().data()};
  for (auto& m : model->mlp_weights()) bases.push_back(m.data());
  size_t at = 0;
  for (const auto& runs : runs_) {
    for (const Run& run : runs) {
      // A run never crosses a table: find its tensor.
      const auto k = static_cast<size_t>(
          std::upper_bound(tensor_starts_.begin(), tensor_starts_.end(), run.flat_offset) -
          tensor_starts_.begin() - 1);
      std::memcpy(bases[k] + (run.flat_offset - tensor_starts_[k]), packed_.data() + at,
                  run.length * sizeof(float));
      at += run.length;
    }
  }
  if (model->mixed_precision()) model->RefreshWorkingCopyAll();
  return Status::OK();
}

void ShardedUpdate::AppendState(std::string* out) const {
  for (const auto& table : tables_) cpu::AppendAdamTable(table.adam, out);
}

Status ShardedUpdate::RestoreState(std::string_view* in, uint64_t step,
                                   const HashGridModel& model) {
  for (size_t t = 0; t < tables_.size(); ++t) {
    GRIDSYNC_RETURN_IF_ERROR(cpu::TakeAdamTable(
        in, step, "Adam state of this worker's slice of table " + std::to_string(t),
        &tables_[t].adam));
  }
  // Adam steps this copy of the slice's parameters, not the model's.
  SliceParams(model);
  return Status::OK();
}

uint64_t ShardedUpdate::StateBytes() const {
  uint64_t bytes = 0;
  for (const auto& table : tables_) bytes += cpu::AdamTableBytes(table.adam);
  return bytes;
}

}  // namespace gridsync
