// ps_internal::SplitAll (ps_client_internal.h).
//
// Thread safety: see ps_client_internal.h.
#include <algorithm>

#include "worker/ps_client_internal.h"

namespace gridsync::ps_internal {
namespace {

// The first `n` elements of *given, taken whole; *given is left empty.
template <typename T, typename Alloc>
std::vector<T, Alloc> TakeFirst(std::vector<T, Alloc>* given, size_t n) {
  std::vector<T, Alloc> taken = std::move(*given);
  given->clear();
  taken.resize(n);
  return taken;
}

// Rows [begin, end) of a table reference, all owned by `shard`.
struct Run {
  size_t begin;
  size_t end;
  uint32_t shard;
};

}  // namespace

std::vector<std::vector<wire::OutBlock>> SplitAll(const Partition& partition,
                                                  const std::vector<TableRowsRef>& tables,
                                                  bool with_values) {
  const uint32_t shards = partition.shards();
  std::vector<std::vector<wire::OutBlock>> out(shards);
  for (const auto& ref : tables) {
    const uint32_t t = ref.table;
    const uint32_t width = partition.table(t).width;
    const uint32_t groups = partition.ColumnGroups(t);
    const uint32_t cw = partition.ColWidth(t);
    const size_t n = ref.dense ? partition.table(t).rows : ref.row_count;
    auto row_at = [&](size_t i) { return ref.dense ? static_cast<uint32_t>(i) : ref.rows[i]; };
    std::vector<int> index(shards, -1);
    std::vector<Run> runs;
    std::vector<size_t> rows_of(shards);
    for (uint32_t g = 0; g < groups; ++g) {
      const uint32_t col = partition.ColBegin(t, g);
      // Rows are ascending and ownership changes only at block boundaries,
      // so each run of rows inside one block moves in bulk. The runs come
      // first, so that every shard's block is allocated once at its final
      // size: growing it run by run copied the rows and values about twice
      // over (perf: 4% of a pushpull iteration in memmove).
      runs.clear();
      std::fill(rows_of.begin(), rows_of.end(), 0);
      for (size_t i = 0; i < n;) {
        const uint32_t row = row_at(i);
        const uint32_t shard = partition.Owner(t, row, g);
        const uint64_t limit = (uint64_t{row} / kRowBlock + 1) * kRowBlock;
        size_t j;
        if (ref.dense) {
          j = std::min<uint64_t>(n, limit);
        } else {
          j = static_cast<size_t>(std::lower_bound(ref.rows + i, ref.rows + n, limit) - ref.rows);
        }
        runs.push_back({i, j, shard});
        rows_of[shard] += j - i;
        i = j;
      }
      const bool values = with_values && ref.values != nullptr;
      // Zero copy: a table that goes to one shard whole (one column group,
      // one owner) takes the caller's vectors (TableRowsRef::give_*) as its
      // block's rows and values instead of copying them run by run.
      const bool give =
          values && cw == width && ref.give_values != nullptr &&
          ref.give_values->data() == ref.values && ref.give_values->size() >= n * width &&
          (ref.dense || (ref.give_rows != nullptr && ref.give_rows->data() == ref.rows &&
                         ref.give_rows->size() >= n)) &&
          std::all_of(runs.begin(), runs.end(),
                      [&](const Run& run) { return run.shard == runs.front().shard; });
      for (uint32_t shard = 0; shard < shards; ++shard) {
        if (rows_of[shard] == 0) continue;
        if (index[shard] < 0) {
          index[shard] = static_cast<int>(out[shard].size());
          wire::OutBlock block;
          block.table = t;
          block.col_begin = col;
          block.width = cw;
          out[shard].push_back(std::move(block));
        }
        wire::OutBlock& block = out[shard][static_cast<size_t>(index[shard])];
        if (give) {
          // Never grows: at least n rows were given. A dense table's ids
          // are still counted out below.
          if (!ref.dense) block.rows = TakeFirst(ref.give_rows, n);
          block.values = TakeFirst(ref.give_values, n * width);
          continue;
        }
        block.rows.reserve(block.rows.size() + rows_of[shard]);
        if (values) block.values.reserve(block.values.size() + rows_of[shard] * cw);
      }
      for (const Run& run : runs) {
        const size_t i = run.begin, j = run.end;
        wire::OutBlock& block = out[run.shard][static_cast<size_t>(index[run.shard])];
        if (ref.dense) {
          for (size_t k = i; k < j; ++k) block.rows.push_back(static_cast<uint32_t>(k));
        } else if (!give) {
          block.rows.insert(block.rows.end(), ref.rows + i, ref.rows + j);
        }
        if (values && !give) {
          if (cw == width) {
            block.values.insert(block.values.end(), ref.values + i * width, ref.values + j * width);
          } else {
            for (size_t k = i; k < j; ++k) {
              const float* v = ref.values + k * width + col;
              block.values.insert(block.values.end(), v, v + cw);
            }
          }
        }
      }
    }
    for (uint32_t s = 0; s < shards; ++s) {
      if (index[s] < 0) continue;
      wire::OutBlock& block = out[s][static_cast<size_t>(index[s])];
      block.row_count = static_cast<uint32_t>(block.rows.size());
      if (ref.dense && block.rows.back() - block.rows.front() + 1 == block.rows.size()) {
        block.dense = true;
        block.row_begin = block.rows.front();
        block.rows.clear();
      }
    }
  }
  return out;
}

}  // namespace gridsync::ps_internal
