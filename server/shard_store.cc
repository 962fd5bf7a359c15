#include "server/shard_store.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "common/prefetch.h"
#include "common/row_width.h"
#include "common/state_bytes.h"
#include "kernels/cpu/adam_batch.h"

namespace gridsync {
namespace {

// Rows this far ahead have their parameters (and Adam's state) prefetched:
// a sparse request's rows are scattered over tables far larger than the
// caches.
constexpr size_t kPrefetchRows = 16;

// Prefetches row i + kPrefetchRows's parameters, m, v and step count when
// it starts a cache line of the parameters the rows before it did not
// touch: close rows (a batch's coarse levels, or a push sorted by row)
// share lines, and four prefetches for every row cost more than the loads
// they hide there. Lines are counted from the arrays' starts: m and v have
// the parameters' layout, and a line of step counts (16 rows) begins where
// a counted parameter line does. (The arrays are only 16-byte aligned, so
// a counted line may straddle two real ones; the other is its neighbour,
// which the hardware prefetcher fetches on an ascending walk.)
template <typename LocalOf>
inline void PrefetchAdamRowAhead(LocalOf local_of, size_t i, size_t end, uint32_t w,
                                 const float* params, const float* m, const float* v,
                                 const uint32_t* steps, uint64_t* prefetched_line) {
  if (i + kPrefetchRows >= end) return;
  const uint64_t ahead = local_of(i + kPrefetchRows);
  const uint64_t line = ahead * w * sizeof(float) / 64;
  if (line == *prefetched_line) return;
  *prefetched_line = line;
  PrefetchRow(params + ahead * w);
  PrefetchRow(m + ahead * w);
  PrefetchRow(v + ahead * w);
  PrefetchRow(steps + ahead);
}

}  // namespace

ShardStore::ShardStore(const Partition& partition, uint32_t shard, const AdamHyper& hyper,
                       bool apply_updates)
    : partition_(partition), shard_(shard), hyper_(hyper), apply_updates_(apply_updates) {
  tables_.resize(partition.n_tables());
  for (uint32_t t = 0; t < partition.n_tables(); ++t) {
    Table& table = tables_[t];
    table.column_group = partition.ColumnGroupOf(shard, t);
    table.width = partition.ColWidth(t);
    table.col_begin = partition.ColBegin(t, table.column_group);
    const uint64_t rows = partition.LocalRows(shard, t);
    table.params.assign(rows * table.width, 0.0f);
    table.grad.assign(rows * table.width, 0.0f);
    table.touched.assign((rows + 63) / 64, 0);
    if (apply_updates_) {
      table.pushes.assign(rows, 0);
    } else {
      table.adam.Resize(rows, table.width);
    }
  }
}

uint64_t ShardStore::owned_rows() const {
  uint64_t rows = 0;
  for (uint32_t t = 0; t < n_tables(); ++t) rows += partition_.OwnedRows(shard_, t);
  return rows;
}

Status ShardStore::CheckOwnership(const wire::Block& block) const {
  if (!block.rows_named()) {
    return Status::InvalidArgument("table " + std::to_string(block.table) + ": a sparse block of " +
                                   std::to_string(block.row_count) +
                                   " rows without row ids; allowed: dense blocks or row ids");
  }
  const Table& table = tables_[block.table];
  const auto& info = partition_.table(block.table);
  if (block.col_begin != table.col_begin || block.width != table.width) {
    return Status::InvalidArgument(
        "table " + std::to_string(block.table) + " (" + info.name + "): columns [" +
        std::to_string(block.col_begin) + ", " + std::to_string(block.col_begin + block.width) +
        ") are not this shard's; allowed: exactly columns [" + std::to_string(table.col_begin) +
        ", " + std::to_string(table.col_begin + table.width) + ") on shard " +
        std::to_string(shard_));
  }
  // Rows come in whole blocks, so checking the first row of each run of
  // rows in one block is enough; with one row group, every row of the
  // column group has one owner (the decode boundary checked the ids
  // against the table's rows), so one check is.
  const size_t to_check = partition_.RowGroups(block.table) == 1
                              ? std::min<size_t>(block.row_count, 1)
                              : block.row_count;
  uint32_t last_block = UINT32_MAX;
  for (size_t i = 0; i < to_check; ++i) {
    const uint32_t row = block.Row(i);
    if (row / kRowBlock == last_block) continue;
    last_block = row / kRowBlock;
    const uint32_t owner = partition_.Owner(block.table, row, table.column_group);
    if (owner != shard_) {
      return Status::InvalidArgument(
          "table " + std::to_string(block.table) + " (" + info.name + "): row " +
          std::to_string(row) + " belongs to shard " + std::to_string(owner) + ", not shard " +
          std::to_string(shard_) + "; allowed: rows of this shard's blocks (common/sharding.h)");
    }
  }
  return Status::OK();
}

void ShardStore::Accumulate(const wire::Block& block) {
  Table& table = tables_[block.table];
  const uint32_t w = table.width;
  if (block.dense) table.dense_step = true;
  WithLocalRows(block, [&](auto local_of) {
    // The rows are scattered over a table far larger than the caches: fetch
    // the gradient row (and its push count) a few rows ahead, once per line,
    // as the Adam loops do. Without it this loop led a two-worker shard's
    // profile; with it, and the same in the updates' apply below,
    // `gridsync-bench compress --train --workers 2` trained 12-15% faster
    // (medians of 3 alternated pairs, 2026-12-04).
    uint64_t prefetched_line = UINT64_MAX;
    for (size_t i = 0; i < block.row_count; ++i) {
      if (i + kPrefetchRows < block.row_count) {
        const uint64_t ahead = local_of(i + kPrefetchRows);
        const uint64_t line = ahead * w * sizeof(float) / 64;
        if (line != prefetched_line) {
          prefetched_line = line;
          PrefetchRow(table.grad.data() + ahead * w);
          if (apply_updates_) PrefetchRow(table.pushes.data() + ahead);
        }
      }
      const uint64_t local = local_of(i);
      float* g = table.grad.data() + local * w;
      const float* v = block.values.data() + i * w;
      for (uint32_t f = 0; f < w; ++f) g[f] += v[f];
      if (apply_updates_) ++table.pushes[local];
      uint64_t& word = table.touched[local >> 6];
      const uint64_t bit = uint64_t{1} << (local & 63);
      if ((word & bit) == 0) {
        word |= bit;
        table.touched_rows.push_back(static_cast<uint32_t>(local));
      }
    }
  });
}

size_t ShardStore::TouchedChunks(uint32_t t, size_t chunk_rows) const {
  return (tables_[t].touched_rows.size() + chunk_rows - 1) / chunk_rows;
}

void ShardStore::ApplyTouchedChunk(uint32_t t, size_t chunk, size_t chunk_rows) {
  Table& table = tables_[t];
  const size_t begin = chunk * chunk_rows;
  const size_t end = std::min(table.touched_rows.size(), begin + chunk_rows);
  if (apply_updates_) {
    const uint32_t w = table.width;
    for (size_t i = begin; i < end; ++i) {
      if (i + kPrefetchRows < end) {
        const size_t ahead = table.touched_rows[i + kPrefetchRows];
        PrefetchRow(table.grad.data() + ahead * w);
        PrefetchRow(table.params.data() + ahead * w);
        PrefetchRow(table.pushes.data() + ahead);
      }
      const uint32_t local = table.touched_rows[i];
      float* g = table.grad.data() + size_t{local} * w;
      float* p = table.params.data() + size_t{local} * w;
      const uint32_t n = table.pushes[local];
      table.pushes[local] = 0;
      // One push: add as is (bit-exact with the worker's own Adam).
      const float inv = n > 1 ? 1.0f / static_cast<float>(n) : 1.0f;
      for (uint32_t f = 0; f < w; ++f) {
        p[f] = MovedByMean(p[f], g[f], inv);
        g[f] = 0.0f;
      }
    }
    return;
  }
  cpu::AdamUpdateIndexed(hyper_, table.touched_rows.data() + begin, end - begin, table.grad.data(),
                         table.params.data(), &table.adam, /*skip_zero_rows=*/!table.dense_step,
                         lr_scale_);
}

void ShardStore::FinishTable(uint32_t t) {
  Table& table = tables_[t];
  for (uint32_t local : table.touched_rows) table.touched[local >> 6] = 0;
  table.touched_rows.clear();
  table.dense_step = false;
}

void ShardStore::PrepareStep() {
  ++steps_prepared_;
  if (apply_updates_) return;
  for (Table& table : tables_) table.adam.ReserveSteps(hyper_, steps_prepared_ + 1);
}

void ShardStore::ApplyDirect(const wire::Block& block, size_t begin, size_t end) {
  Table& table = tables_[block.table];
  const uint32_t w = table.width;
  WithLocalRows(block, [&](auto local_of) {
    WithRowWidth(w, [&](auto constant) {
      if (!apply_updates_) return AdamRows<constant>(block, local_of, begin, end, w, &table);
      const uint32_t width = RowWidth(constant, w);
      float* params = table.params.data();
      for (size_t i = begin; i < end; ++i) {
        if (i + kPrefetchRows < end) PrefetchRow(params + local_of(i + kPrefetchRows) * width);
        const float* u = block.values.data() + i * width;
        float* p = params + local_of(i) * width;
        for (uint32_t f = 0; f < width; ++f) p[f] += u[f];
      }
    });
  });
}

template <uint32_t W, typename LocalOf>
void ShardStore::AdamRows(const wire::Block& block, LocalOf local_of, size_t begin, size_t end,
                          uint32_t width, Table* table) {
  const uint32_t w = W > 0 ? W : width;
  float* params = table->params.data();
  float* m = table->adam.m.data();
  float* v = table->adam.v.data();
  uint32_t* steps = table->adam.step.data();
  // W = 0 (any width) keeps the row-at-a-time loop; the batch needs W.
  cpu::AdamRowBatch<(W > 0 ? W : 1)> batch(hyper_, params, m, v);
  uint64_t prefetched_line = UINT64_MAX;
  for (size_t i = begin; i < end; ++i) {
    PrefetchAdamRowAhead(local_of, i, end, w, params, m, v, steps, &prefetched_line);
    const float* g = block.values.data() + i * w;
    if (!block.dense && !RowHasGradient(g, w)) continue;  // dense tables always step
    const uint64_t local = local_of(i);
    const float lr = table->adam.StepSize(hyper_, ++steps[local]) * lr_scale_;
    if constexpr (W > 0) {
      batch.Add(g, 1.0f, lr, local);
      continue;
    }
    for (uint32_t f = 0; f < w; ++f) {
      const size_t at = local * w + f;
      AdamUpdate(hyper_, lr, g[f], &params[at], &m[at], &v[at]);
    }
  }
  if constexpr (W > 0) batch.Flush();
}

void ShardStore::Assign(const wire::Block& block) {
  Table& table = tables_[block.table];
  const uint32_t w = table.width;
  for (size_t i = 0; i < block.row_count; ++i) {
    const uint64_t local = partition_.LocalRow(block.table, block.Row(i));
    std::memcpy(table.params.data() + local * w, block.values.data() + i * w, w * sizeof(float));
    // Every worker starts from the initial values.
    for (auto& replica : table.replicas) {
      std::memcpy(replica.data() + local * w, block.values.data() + i * w, w * sizeof(float));
    }
  }
}

void ShardStore::AppendState(std::string* out) const {
  for (const Table& table : tables_) {
    AppendArray(out, table.params);
    if (!apply_updates_) {
      AppendArray(out, table.adam.m);
      AppendArray(out, table.adam.v);
      AppendArray(out, table.adam.step);
    }
    // Delta pulls: each worker's replica as this shard knows it, so that a
    // rollback puts both ends of every delta back where they were at the
    // step (the worker keeps its own in its state) and a run resumed or
    // rolled back ends bit for bit as an uninterrupted one.
    for (const auto& replica : table.replicas) AppendArray(out, replica);
  }
}

Status ShardStore::CheckParams(uint32_t t) const {
  const Table& table = tables_[t];
  const float bound = wire::Limits{}.max_abs_value;
  for (size_t r = 0; r <= table.replicas.size(); ++r) {
    // r = 0: the parameters; then worker r - 1's replica.
    const HugePageVector<float>& values = r == 0 ? table.params : table.replicas[r - 1];
    const size_t at = wire::FirstOutOfBounds(values, bound);
    if (at == values.size()) continue;
    return Status::Corruption(fmt::format(
        "table {}: {} {} of local row {}, column {} is {}; allowed: finite and at most {:g} "
        "in magnitude (what pushes and pulls carry), so the file is damaged or not this run's",
        t, r == 0 ? "parameter" : fmt::format("worker {}'s replica value", r - 1), at,
        at / table.width, table.col_begin + at % table.width, values[at], double{bound}));
  }
  return Status::OK();
}

uint64_t ShardStore::StateBytes() const {
  uint64_t bytes = 0;
  for (const Table& table : tables_) {
    bytes += (1 + table.replicas.size()) * table.params.size() * sizeof(float);
    if (!apply_updates_) {
      bytes += (table.adam.m.size() + table.adam.v.size()) * sizeof(float) +
               table.adam.step.size() * sizeof(uint32_t);
    }
  }
  return bytes;
}

Status ShardStore::RestoreState(std::string_view data, uint64_t step) {
  const size_t size = data.size();
  uint32_t max_step = 0;
  for (uint32_t t = 0; t < tables_.size(); ++t) {
    Table& table = tables_[t];
    bool ok = TakeArray(&data, &table.params);
    if (!apply_updates_) {
      ok = ok && TakeArray(&data, &table.adam.m) && TakeArray(&data, &table.adam.v) &&
           TakeArray(&data, &table.adam.step);
    }
    for (auto& replica : table.replicas) ok = ok && TakeArray(&data, &replica);
    if (!ok) {
      return Status::Corruption(
          std::to_string(size) + " bytes: too short for this partition" +
          (replica_workers_ > 0 ? " with a replica of the parameters per worker (compression.pull)"
                                : ""));
    }
    GRIDSYNC_RETURN_IF_ERROR(CheckParams(t));
    if (apply_updates_) continue;
    const std::string what = "table " + std::to_string(t);
    GRIDSYNC_RETURN_IF_ERROR(cpu::CheckStepCounts(table.adam, step, what));
    GRIDSYNC_RETURN_IF_ERROR(cpu::CheckMoments(table.adam, what));
    for (uint32_t s : table.adam.step) max_step = std::max(max_step, s);
  }
  if (!data.empty()) {
    return Status::Corruption(std::to_string(data.size()) + " bytes beyond this partition's state");
  }
  // The step-size memo must cover every restored row's next step.
  steps_prepared_ = max_step;
  if (!apply_updates_) {
    for (Table& table : tables_) table.adam.ReserveSteps(hyper_, steps_prepared_ + 1);
  }
  return Status::OK();
}

void ShardStore::EnableReplicas(uint32_t workers) {
  replica_workers_ = workers;
  for (Table& table : tables_) table.replicas.assign(workers, table.params);
}

void ShardStore::GatherDelta(const wire::Block& request, uint32_t worker, size_t begin, size_t end,
                             float* out) const {
  const Table& table = tables_[request.table];
  const float* params = table.params.data();
  const float* replica = table.replicas[worker].data();
  WithLocalRows(request, [&](auto local_of) {
    WithRowWidth(table.width, [&](auto constant) {
      const uint32_t w = RowWidth(constant, table.width);
      for (size_t i = begin; i < end; ++i) {
        if (i + kPrefetchRows < end) {
          const uint64_t ahead = local_of(i + kPrefetchRows);
          PrefetchRow(params + ahead * w);
          PrefetchRow(replica + ahead * w);
        }
        const uint64_t local = local_of(i);
        float* dst = out + (i - begin) * w;
        for (uint32_t f = 0; f < w; ++f) dst[f] = params[local * w + f] - replica[local * w + f];
      }
    });
  });
}

void ShardStore::AdvanceReplica(const wire::Block& request, uint32_t worker, size_t begin,
                                size_t end, const float* delivered, bool whole) {
  Table& table = tables_[request.table];
  float* replica = table.replicas[worker].data();
  WithLocalRows(request, [&](auto local_of) {
    WithRowWidth(table.width, [&](auto constant) {
      const uint32_t w = RowWidth(constant, table.width);
      for (size_t i = begin; i < end; ++i) {
        const float* src = delivered + (i - begin) * w;
        float* dst = replica + local_of(i) * w;
        if (whole) {
          for (uint32_t f = 0; f < w; ++f) dst[f] = src[f];
        } else {
          for (uint32_t f = 0; f < w; ++f) dst[f] += src[f];
        }
      }
    });
  });
}

void ShardStore::Gather(const wire::Block& request, size_t begin, size_t end, float* out) const {
  const Table& table = tables_[request.table];
  const float* params = table.params.data();
  WithLocalRows(request, [&](auto local_of) {
    WithRowWidth(table.width, [&](auto constant) {
      const uint32_t w = RowWidth(constant, table.width);
      for (size_t i = begin; i < end; ++i) {
        if (i + kPrefetchRows < end) PrefetchRow(params + local_of(i + kPrefetchRows) * w);
        const float* src = params + local_of(i) * w;
        float* dst = out + (i - begin) * w;
        for (uint32_t f = 0; f < w; ++f) dst[f] = src[f];
      }
    });
  });
}

void ShardStore::GatherAhead(const wire::Block& request, size_t begin, size_t end,
                             float steps_ahead, float* out) const {
  const Table& table = tables_[request.table];
  const float* params = table.params.data();
  const float* m = table.adam.m.data();
  const float* v = table.adam.v.data();
  const uint32_t* steps = table.adam.step.data();
  WithLocalRows(request, [&](auto local_of) {
    WithRowWidth(table.width, [&](auto constant) {
      const uint32_t w = RowWidth(constant, table.width);
      // Four arrays read at scattered rows, as Adam reads them.
      uint64_t prefetched_line = UINT64_MAX;
      for (size_t i = begin; i < end; ++i) {
        PrefetchAdamRowAhead(local_of, i, end, w, params, m, v, steps, &prefetched_line);
        const uint64_t local = local_of(i);
        const uint32_t t = steps[local];
        const float* src = params + local * w;
        float* dst = out + (i - begin) * w;
        if (t == 0) {
          for (uint32_t f = 0; f < w; ++f) dst[f] = src[f];
          continue;
        }
        const float step = table.adam.StepSizeAt(hyper_, t) * steps_ahead;
        const float* mr = m + local * w;
        const float* vr = v + local * w;
        for (uint32_t f = 0; f < w; ++f) {
          dst[f] = src[f] - step * mr[f] / (sqrtf(vr[f]) + hyper_.epsilon);
        }
      }
    });
  });
}

}  // namespace gridsync
