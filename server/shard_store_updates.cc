// ShardStore's steps (server/shard_store.h): a step's pushes applied as the
// shard applies them (ApplyPushes), each table's pushes merged by row and
// applied in one pass, with Adam or with worker updates (ps.optimizer =
// worker), skipping the sum's buffer.
//
// Thread safety: see server/shard_store.h.
#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <vector>

#include "common/prefetch.h"
#include "common/row_width.h"
#include "common/thread_pool.h"
#include "kernels/cpu/adam_batch.h"
#include "server/shard_store.h"

namespace gridsync {
namespace {

// Rows this far ahead have their parameters prefetched, as in
// shard_store.cc: a push's rows are scattered over tables far larger than
// the caches.
constexpr size_t kPrefetchRows = 16;

// ShardStore::MergeRows' cursors, merged without a branch on which of them
// list the row: whether a cursor takes a row is as likely as not, so a
// branch on it mispredicted about every other row, and with the rows
// ascending (the parameters stream in order) the loop was much of the
// merge's cost. A cursor that does not take the row adds -0.0f, which
// leaves every sum (+0.0f included) as it is, so each row's sum is still
// 0.0f and then its listing pushes in rank order, bit for bit.
struct MergeCursor {
  const uint32_t* rows;
  const float* values;
  size_t last;  // row_count - 1
  size_t at;
};
constexpr uint32_t kMergeEnd = UINT32_MAX;  // no row: a table has fewer than 2^32 rows

// The merge of K non-empty cursors, K known at compile time so that the
// loops over cursors unroll and the cursors stay in registers (a loop over
// a run-time count kept them in memory, loaded and stored every row).
template <uint32_t W, size_t K, typename LocalOf, typename Prefetch, typename Step>
void MergeCursors(const MergeCursor* from, LocalOf local_of, uint32_t w, Prefetch prefetch,
                  Step step) {
  std::array<MergeCursor, K> cursors;
  std::array<uint32_t, K> next;  // the cursor's row, or kMergeEnd
  for (size_t b = 0; b < K; ++b) {
    cursors[b] = from[b];
    next[b] = from[b].rows[0];
  }
  std::array<float, (W > 0 ? W : 1)> fixed{};
  std::vector<float> any_width(W > 0 ? 0 : w);
  float* sum = W > 0 ? fixed.data() : any_width.data();
  for (;;) {
    uint32_t row = kMergeEnd;
    for (size_t b = 0; b < K; ++b) row = std::min(row, next[b]);
    if (row == kMergeEnd) break;
    for (uint32_t f = 0; f < w; ++f) sum[f] = 0.0f;
    uint32_t n = 0;
    for (size_t b = 0; b < K; ++b) {
      MergeCursor& c = cursors[b];
      const bool take = next[b] == row;
      // Clamped: an exhausted cursor (never taking) reads its last row.
      const float* u = c.values + std::min(c.at, c.last) * w;
      for (uint32_t f = 0; f < w; ++f) sum[f] += take ? u[f] : -0.0f;
      n += take ? 1u : 0u;
      c.at += take ? 1u : 0u;
      const uint32_t at_row = c.rows[std::min(c.at, c.last)];
      next[b] = c.at > c.last ? kMergeEnd : at_row;
      prefetch(local_of(c.rows[std::min(c.at + kPrefetchRows, c.last)]));
    }
    step(local_of(row), sum, n);
  }
}

template <uint32_t W, size_t K, typename LocalOf, typename Prefetch, typename Step>
void MergeCursorsUpTo(const MergeCursor* cursors, size_t k, LocalOf local_of, uint32_t w,
                      Prefetch prefetch, Step step) {
  if constexpr (K > 0) {
    if (k == K) return MergeCursors<W, K>(cursors, local_of, w, prefetch, step);
    return MergeCursorsUpTo<W, K - 1>(cursors, k, local_of, w, prefetch, step);
  }
}

}  // namespace

void ShardStore::ApplyPushes(const std::vector<const wire::Message*>& pushes, ThreadPool* pool) {
  constexpr size_t kChunkRows = 8192;
  PrepareStep();
  struct Piece {
    uint32_t table;
    size_t chunk;                        // touched-row chunk (summed) ...
    const wire::Block* block = nullptr;  // ... or a row range of a single push
    size_t begin = 0, end = 0;
  };
  std::vector<Piece> pieces;
  if (pushes.size() == 1) {
    for (const auto& block : pushes[0]->blocks) {
      for (size_t begin = 0; begin < block.row_count; begin += kChunkRows) {
        pieces.push_back(
            {block.table, 0, &block, begin, std::min<size_t>(block.row_count, begin + kChunkRows)});
      }
    }
    ParallelForOn(pool, pieces.size(),
                  [&](size_t i) { ApplyDirect(*pieces[i].block, pieces[i].begin, pieces[i].end); });
    return;
  }
  // A table's pushes are merged and applied in one pass
  // (ShardStore::ApplyMerged); past kMaxMergedPushes they are summed, and
  // the apply steps the touched rows.
  ParallelForOn(pool, n_tables(), [&](size_t t) {
    std::vector<const wire::Block*> blocks;
    for (const wire::Message* m : pushes) {
      for (const auto& block : m->blocks) {
        if (block.table == t) blocks.push_back(&block);
      }
    }
    if (ApplyMerged(blocks)) return;
    for (const wire::Block* block : blocks) Accumulate(*block);
  });
  for (uint32_t t = 0; t < n_tables(); ++t) {
    for (size_t c = 0; c < TouchedChunks(t, kChunkRows); ++c) pieces.push_back({t, c});
  }
  ParallelForOn(pool, pieces.size(),
                [&](size_t i) { ApplyTouchedChunk(pieces[i].table, pieces[i].chunk, kChunkRows); });
  for (uint32_t t = 0; t < n_tables(); ++t) FinishTable(t);
}

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
  // Each block's rows ascend (the decode boundary refuses others), so one
  // cursor a block walks them all in order. A dense block (MLP weights, a
  // few thousand rows) gets its row ids written out, so that one merge
  // serves both kinds.
  std::array<std::vector<uint32_t>, kMaxMergedPushes> dense_rows;
  std::array<MergeCursor, kMaxMergedPushes> cursors;
  size_t k = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const wire::Block& block = *blocks[b];
    if (block.row_count == 0) continue;
    const uint32_t* rows = block.rows.data();
    if (block.dense) {
      dense_rows[b].resize(block.row_count);
      std::iota(dense_rows[b].begin(), dense_rows[b].end(), block.row_begin);
      rows = dense_rows[b].data();
    }
    cursors[k++] = {rows, block.values.data(), block.row_count - size_t{1}, 0};
  }
  MergeCursorsUpTo<W, kMaxMergedPushes>(cursors.data(), k, local_of, w, prefetch, step);
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
