// ShardStore's merged steps (server/shard_store.h): a step's pushes of a
// table merged by row and applied in one pass, with Adam or with worker
// updates (ps.optimizer = worker), skipping the sum's buffer.
//
// Thread safety: see server/shard_store.h.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "common/prefetch.h"
#include "common/row_width.h"
#include "kernels/cpu/adam_batch.h"
#include "server/shard_store.h"

namespace gridsync {
namespace {

// Rows this far ahead have their parameters prefetched, as in
// shard_store.cc: a push's rows are scattered over tables far larger than
// the caches.
constexpr size_t kPrefetchRows = 16;

// MergeRows for sparse blocks (every hash-grid push), without a branch on
// which cursors list the row: whether a cursor takes a row is as likely as
// not, so a branch on it mispredicted about every other row, and with the
// rows ascending (the parameters stream in order) that, not memory, was
// the merge's cost. A cursor that does not take the row adds -0.0f, which
// leaves every sum (+0.0f included) as it is, so each row's sum is still
// 0.0f and then its listing pushes in rank order, bit for bit. Blocks must
// be sparse; empty ones may be listed.
template <uint32_t W, typename LocalOf, typename Prefetch, typename Step>
void MergeSparseRows(const std::vector<const wire::Block*>& blocks, LocalOf local_of, uint32_t w,
                     Prefetch prefetch, Step step) {
  constexpr uint32_t kEnd = UINT32_MAX;  // no row: a table has fewer than 2^32 rows
  struct Cursor {
    const uint32_t* rows;
    const float* values;
    size_t last;  // row_count - 1
    size_t at;
  };
  std::array<Cursor, ShardStore::kMaxMergedPushes> cursors;
  std::array<uint32_t, ShardStore::kMaxMergedPushes> next;  // the cursor's row, or kEnd
  size_t k = 0;
  for (const wire::Block* block : blocks) {
    if (block->row_count == 0) continue;
    cursors[k] = {block->rows.data(), block->values.data(), block->row_count - size_t{1}, 0};
    next[k] = block->rows[0];
    ++k;
  }
  std::array<float, (W > 0 ? W : 1)> fixed{};
  std::vector<float> any_width(W > 0 ? 0 : w);
  float* sum = W > 0 ? fixed.data() : any_width.data();
  for (;;) {
    uint32_t row = kEnd;
    for (size_t b = 0; b < k; ++b) row = std::min(row, next[b]);
    if (row == kEnd) break;
    for (uint32_t f = 0; f < w; ++f) sum[f] = 0.0f;
    uint32_t n = 0;
    for (size_t b = 0; b < k; ++b) {
      Cursor& c = cursors[b];
      const bool take = next[b] == row;
      // Clamped: an exhausted cursor (never taking) reads its last row.
      const float* u = c.values + std::min(c.at, c.last) * w;
      for (uint32_t f = 0; f < w; ++f) sum[f] += take ? u[f] : -0.0f;
      n += take ? 1u : 0u;
      c.at += take ? 1u : 0u;
      const uint32_t at_row = c.rows[std::min(c.at, c.last)];
      next[b] = c.at > c.last ? kEnd : at_row;
      prefetch(local_of(c.rows[std::min(c.at + kPrefetchRows, c.last)]));
    }
    step(local_of(row), sum, n);
  }
}

}  // namespace

bool ShardStore::ApplyMerged(const std::vector<const wire::Block*>& blocks) {
  if (blocks.size() > kMaxMergedPushes) return false;
  if (blocks.empty()) return true;  // no push listed the table
  Table& table = tables_[blocks[0]->table];
  const uint32_t t = blocks[0]->table;
  bool dense = false;
  for (const wire::Block* block : blocks) dense = dense || block->dense;
  WithRowWidth(table.width, [&](auto constant) {
    const auto merge = [&](auto local_of) {
      if (apply_updates_) return MergeUpdates<constant>(blocks, local_of, table.width, &table);
      MergeAdam<constant>(blocks, local_of, table.width, dense, &table);
    };
    if (partition_.RowGroups(t) == 1) {
      merge([](uint32_t row) -> uint64_t { return row; });
    } else {
      merge([this, t](uint32_t row) { return partition_.LocalRow(t, row); });
    }
  });
  return true;
}

template <uint32_t W, typename LocalOf, typename Prefetch, typename Step>
void ShardStore::MergeRows(const std::vector<const wire::Block*>& blocks, LocalOf local_of,
                           uint32_t width, Prefetch prefetch, Step step) {
  const uint32_t w = W > 0 ? W : width;
  bool any_dense = false;
  for (const wire::Block* block : blocks) any_dense = any_dense || block->dense;
  if (!any_dense) return MergeSparseRows<W>(blocks, local_of, w, prefetch, step);
  const size_t k = blocks.size();
  // Each block's rows ascend (the decode boundary refuses others), so one
  // cursor a block walks them all in order.
  std::array<size_t, kMaxMergedPushes> at{};
  const auto row_of = [&](size_t b, size_t i) -> uint32_t {
    const wire::Block& block = *blocks[b];
    return block.dense ? block.row_begin + static_cast<uint32_t>(i) : block.rows[i];
  };
  std::vector<float> sum(w);
  for (;;) {
    uint32_t row = UINT32_MAX;
    bool any = false;
    for (size_t b = 0; b < k; ++b) {
      if (at[b] == blocks[b]->row_count) continue;
      row = std::min(row, row_of(b, at[b]));
      any = true;
    }
    if (!any) break;
    // The sum the buffer made: 0.0f, then each listing push in rank order.
    for (uint32_t f = 0; f < w; ++f) sum[f] = 0.0f;
    uint32_t n = 0;
    for (size_t b = 0; b < k; ++b) {
      const size_t i = at[b];
      if (i == blocks[b]->row_count || row_of(b, i) != row) continue;
      if (i + kPrefetchRows < blocks[b]->row_count)
        prefetch(local_of(row_of(b, i + kPrefetchRows)));
      const float* u = blocks[b]->values.data() + i * w;
      for (uint32_t f = 0; f < w; ++f) sum[f] += u[f];
      ++n;
      ++at[b];
    }
    step(local_of(row), sum.data(), n);
  }
}

template <uint32_t W, typename LocalOf>
void ShardStore::MergeUpdates(const std::vector<const wire::Block*>& blocks, LocalOf local_of,
                              uint32_t width, Table* table) {
  const uint32_t w = W > 0 ? W : width;
  float* params = table->params.data();
  MergeRows<W>(
      blocks, local_of, width, [&](uint64_t local) { PrefetchRow(params + local * w); },
      [&](uint64_t local, const float* sum, uint32_t n) {
        // The apply's arithmetic (ApplyTouchedChunk): one push as it is,
        // several by their mean.
        float* p = params + local * w;
        const float inv = n > 1 ? 1.0f / static_cast<float>(n) : 1.0f;
        for (uint32_t f = 0; f < w; ++f) p[f] = MovedByMean(p[f], sum[f], inv);
      });
}

template <uint32_t W, typename LocalOf>
void ShardStore::MergeAdam(const std::vector<const wire::Block*>& blocks, LocalOf local_of,
                           uint32_t width, bool dense, Table* table) {
  const uint32_t w = W > 0 ? W : width;
  float* params = table->params.data();
  float* m = table->adam.m.data();
  float* v = table->adam.v.data();
  uint32_t* steps = table->adam.step.data();
  cpu::AdamRowBatch<(W > 0 ? W : 1)> batch(hyper_, params, m, v);
  MergeRows<W>(
      blocks, local_of, width,
      [&](uint64_t local) {
        PrefetchRow(params + local * w);
        PrefetchRow(m + local * w);
        PrefetchRow(v + local * w);
        PrefetchRow(steps + local);
      },
      [&](uint64_t local, const float* g, uint32_t) {
        // AdamUpdateIndexed's rules: a sparse step leaves a row whose sum
        // is zero alone; a dense one (MLP weights) steps every row.
        if (!dense && !RowHasGradient(g, w)) return;
        const float lr = table->adam.StepSize(hyper_, ++steps[local]) * lr_scale_;
        if constexpr (W > 0) {
          batch.Add(g, 1.0f, lr, local);
        } else {
          for (uint32_t f = 0; f < w; ++f) {
            const size_t at = local * w + f;
            AdamUpdate(hyper_, lr, g[f], &params[at], &m[at], &v[at]);
          }
        }
      });
  if constexpr (W > 0) batch.Flush();
}

}  // namespace gridsync
