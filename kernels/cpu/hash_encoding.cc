#include "kernels/cpu/hash_encoding.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>

#include "common/check.h"
#include "common/prefetch.h"
#include "common/row_width.h"
#include "common/set_bits.h"
#include "kernels/cpu/half.h"

namespace gridsync::cpu {
namespace {

template <uint32_t D>
void LookupLevel(const GridLevelInfo& level, const float* positions, size_t n, uint32_t* rows,
                 float* weights) {
  constexpr uint32_t kCorners = 1u << D;
  GridCorners<D> c;
  for (size_t i = 0; i < n; ++i) {
    GridLookup<D>(level, positions + i * D, &c);
    for (uint32_t k = 0; k < kCorners; ++k) {
      rows[i * kCorners + k] = c.row[k];
      weights[i * kCorners + k] = c.weight[k];
    }
  }
}

inline float LoadParam(const float* p, size_t i) { return p[i]; }
inline float LoadParam(const uint16_t* p, size_t i) { return HalfToFloat(p[i]); }

// Hashed levels scatter a batch's corners over a table far larger than the
// caches and no hardware prefetcher can guess them; the lookup already knows
// them, so fetch a few samples ahead, into L2 (common/prefetch.h). 16
// samples (64 rows in 2-D) measured faster than 4, 8, 24 and 32 in
// `gridsync-bench train` (alternating runs, 2026-12-02).
constexpr size_t kPrefetchSamples = 16;
constexpr size_t kPrefetchRows = 16;

// Samples per task of the lookup and the forward pass. A level alone is too
// coarse a unit for the pool: a batch's work sits on the few finest levels
// (the hashed ones miss the caches), so with many threads most would wait
// on them. Every (level, sample range) writes outputs of its own, so the
// split changes no result.
constexpr size_t kSamplesPerTask = 4096;

// The i-th level to hand a pool: finest (costliest) first, so that the pool
// ends on the cheap ones.
inline uint32_t FinestFirst(uint32_t levels, size_t i) {
  return levels - 1 - static_cast<uint32_t>(i);
}

// Checks the features per level once: the kernels are instantiated for the
// widths a hash grid has.
template <typename Fn>
void WithFeatures(uint32_t F, Fn&& fn) {
  WithRowWidth(F, [&](auto width) {
    if constexpr (width == 0) {
      GRIDSYNC_CHECK(false && "features must be 1, 2, 4 or 8");
    } else {
      fn(width);
    }
  });
}

// Runs fn(level, begin, end) over every level in [0, levels) and its
// samples [0, n) cut into ranges of kSamplesPerTask, FinestFirst.
void ForEachLevelRange(uint32_t levels, size_t n, ThreadPool* pool,
                       const std::function<void(uint32_t, size_t, size_t)>& fn) {
  const size_t ranges = (n + kSamplesPerTask - 1) / kSamplesPerTask;  // none for no samples
  ParallelForOn(pool, size_t{levels} * ranges, [&](size_t task) {
    const uint32_t level = FinestFirst(levels, task / ranges);
    const size_t begin = (task % ranges) * kSamplesPerTask;
    fn(level, begin, std::min(n, begin + kSamplesPerTask));
  });
}

// Samples [begin, end) of one level.
template <uint32_t F, typename P>
void ForwardLevel(const GridBatchLookup& lookup, uint32_t level, size_t begin, size_t end,
                  const P* table, size_t out_width, float* features) {
  const uint32_t corners = lookup.corners;
  const size_t level_base = lookup.Index(level, 0);
  const size_t prefetch_end = end > kPrefetchSamples ? end - kPrefetchSamples : 0;
  for (size_t i = begin; i < end; ++i) {
    const size_t base = lookup.Index(level, i);
    if (i < prefetch_end) {
      const uint32_t* ahead = &lookup.rows[level_base + (i + kPrefetchSamples) * corners];
      for (uint32_t k = 0; k < corners; ++k) PrefetchRow(table + size_t{ahead[k]} * F);
    }
    float acc[F] = {};
    for (uint32_t k = 0; k < corners; ++k) {
      const float w = lookup.weights[base + k];
      const size_t row = lookup.rows[base + k];
      for (uint32_t f = 0; f < F; ++f) acc[f] += w * LoadParam(table, row * F + f);
    }
    float* out = features + i * out_width + level * F;
    for (uint32_t f = 0; f < F; ++f) out[f] = acc[f];
  }
}

template <typename P>
void ForwardImpl(const HashGridLayout& layout, const GridBatchLookup& lookup, const P* params,
                 float* features, ThreadPool* pool) {
  const uint32_t width = layout.output_width();
  const uint32_t F = layout.features();
  ForEachLevelRange(
      layout.n_levels(), lookup.n, pool, [&](uint32_t level, size_t begin, size_t end) {
        if (level >= lookup.active_levels) {
          for (size_t i = begin; i < end; ++i)
            std::memset(features + i * width + level * F, 0, F * sizeof(float));
          return;
        }
        const P* table = params + layout.level(level).row_offset * F;
        WithFeatures(
            F, [&](auto f) { ForwardLevel<f>(lookup, level, begin, end, table, width, features); });
      });
}

template <uint32_t F>
void BackwardLevel(const GridBatchLookup& lookup, uint32_t level, const float* d_features,
                   size_t in_width, float* grad, uint64_t* bits) {
  const uint32_t corners = lookup.corners;
  const size_t level_base = lookup.Index(level, 0);
  const size_t prefetch_end = lookup.n > kPrefetchSamples ? lookup.n - kPrefetchSamples : 0;
  for (size_t i = 0; i < lookup.n; ++i) {
    const size_t base = lookup.Index(level, i);
    if (i < prefetch_end) {
      const uint32_t* ahead = &lookup.rows[level_base + (i + kPrefetchSamples) * corners];
      for (uint32_t k = 0; k < corners; ++k) PrefetchRow(grad + size_t{ahead[k]} * F);
    }
    const float* d = d_features + i * in_width + level * F;
    for (uint32_t k = 0; k < corners; ++k) {
      const float w = lookup.weights[base + k];
      const uint32_t row = lookup.rows[base + k];
      bits[row >> 6] |= uint64_t{1} << (row & 63u);
      float* g = grad + size_t{row} * F;
      for (uint32_t f = 0; f < F; ++f) g[f] += w * d[f];
    }
  }
}

// Marks rows[0..n) in a level's bitmap (one bit per row).
void SetRowBits(const uint32_t* rows, size_t n, uint64_t* bits) {
  for (size_t i = 0; i < n; ++i) bits[rows[i] >> 6] |= uint64_t{1} << (rows[i] & 63u);
}

// BackwardLevel into a compact gradient (GridGradient::AccumulateCompact):
// marks the level's touched rows, ranks the bitmap's words, then sums each
// product into its row's slot. The bitmap and the ranks of a 2^19-row level
// take 96 KiB and its slots 512 KiB for 2^16 rows, so both passes stay in
// L2 where BackwardLevel's rows missed to DRAM.
template <uint32_t F>
void BackwardLevelCompact(const GridBatchLookup& lookup, uint32_t level, const float* d_features,
                          size_t in_width, std::vector<uint64_t>* bits, std::vector<uint32_t>* rank,
                          std::vector<float>* values) {
  const uint32_t corners = lookup.corners;
  const uint32_t* rows = &lookup.rows[lookup.Index(level, 0)];
  const float* weights = &lookup.weights[lookup.Index(level, 0)];
  uint64_t* words = bits->data();
  const size_t entries = lookup.n * corners;
  SetRowBits(rows, entries, words);
  rank->resize(bits->size());
  uint32_t count = 0;
  for (size_t w = 0; w < bits->size(); ++w) {
    (*rank)[w] = count;
    count += static_cast<uint32_t>(std::popcount(words[w]));
  }
  values->assign(size_t{count} * F, 0.0f);
  const uint32_t* before = rank->data();
  float* out = values->data();
  for (size_t i = 0; i < lookup.n; ++i) {
    const float* d = d_features + i * in_width + level * F;
    for (uint32_t k = 0; k < corners; ++k) {
      const uint32_t row = rows[i * corners + k];
      const float w = weights[i * corners + k];
      const uint64_t below = words[row >> 6] & ((uint64_t{1} << (row & 63u)) - 1);
      float* g = out + (before[row >> 6] + static_cast<size_t>(std::popcount(below))) * F;
      for (uint32_t f = 0; f < F; ++f) g[f] += w * d[f];
    }
  }
}

}  // namespace

void HashGridLookup(const HashGridLayout& layout, const float* positions, size_t n,
                    uint32_t active_levels, GridBatchLookup* lookup, ThreadPool* pool) {
  const uint32_t dims = layout.spec().dims;
  lookup->n = n;
  lookup->corners = 1u << dims;
  lookup->active_levels = std::min(active_levels, layout.n_levels());
  const size_t entries = size_t{lookup->active_levels} * n * lookup->corners;
  lookup->rows.resize(entries);
  lookup->weights.resize(entries);
  ForEachLevelRange(lookup->active_levels, n, pool, [&](uint32_t level, size_t begin, size_t end) {
    const size_t at = lookup->Index(level, begin);
    const float* p = positions + begin * dims;
    if (dims == 2) {
      LookupLevel<2>(layout.level(level), p, end - begin, &lookup->rows[at], &lookup->weights[at]);
    } else {
      LookupLevel<3>(layout.level(level), p, end - begin, &lookup->rows[at], &lookup->weights[at]);
    }
  });
}

void HashGridForward(const HashGridLayout& layout, const GridBatchLookup& lookup,
                     const float* params, float* features, ThreadPool* pool) {
  ForwardImpl(layout, lookup, params, features, pool);
}

void HashGridForward(const HashGridLayout& layout, const GridBatchLookup& lookup,
                     const uint16_t* params_half, float* features, ThreadPool* pool) {
  ForwardImpl(layout, lookup, params_half, features, pool);
}

GridGradient::GridGradient(const HashGridLayout& layout)
    : layout_(&layout), grad_(layout.total_params(), 0.0f) {
  for (const auto& level : layout.levels()) bits_.emplace_back((level.rows + 63) / 64, 0);
}

void GridGradient::CheckDense() const {
  GRIDSYNC_CHECK(!compact_ && "a compact gradient has no dense buffer (AccumulateCompact)");
}

void GridGradient::Accumulate(const GridBatchLookup& lookup, const float* d_features,
                              ThreadPool* pool) {
  CheckDense();
  const uint32_t F = layout_->features();
  const uint32_t width = layout_->output_width();
  // One task per level: a row's gradient is summed in sample order, so a
  // level cannot be cut by samples.
  pool->ParallelFor(lookup.active_levels, [&](size_t l) {
    const uint32_t level = FinestFirst(lookup.active_levels, l);
    float* grad = grad_.data() + layout_->level(level).row_offset * F;
    uint64_t* bits = bits_[level].data();
    WithFeatures(F,
                 [&](auto f) { BackwardLevel<f>(lookup, level, d_features, width, grad, bits); });
  });
}

void GridGradient::AccumulateCompact(const GridBatchLookup& lookup, const float* d_features,
                                     ThreadPool* pool) {
  CheckDense();  // one compact gradient at a time: a second would lose the first's sums
  const uint32_t F = layout_->features();
  const uint32_t width = layout_->output_width();
  rank_.resize(layout_->n_levels());
  compact_values_.resize(layout_->n_levels());
  compact_ = true;
  for (uint32_t l = lookup.active_levels; l < layout_->n_levels(); ++l) {
    rank_[l].clear();
    compact_values_[l].clear();
  }
  pool->ParallelFor(lookup.active_levels, [&](size_t l) {
    const uint32_t level = FinestFirst(lookup.active_levels, l);
    WithFeatures(F, [&](auto f) {
      BackwardLevelCompact<f>(lookup, level, d_features, width, &bits_[level], &rank_[level],
                              &compact_values_[level]);
    });
  });
}

const float* GridGradient::CompactValues(uint32_t level, uint64_t begin) const {
  GRIDSYNC_CHECK(compact_);
  GRIDSYNC_CHECK_LT(level, rank_.size());
  GRIDSYNC_CHECK_EQ(begin % 64, 0u);
  if (compact_values_[level].empty()) return nullptr;
  GRIDSYNC_CHECK_LT(begin / 64, rank_[level].size());
  return compact_values_[level].data() + size_t{rank_[level][begin / 64]} * layout_->features();
}

uint64_t GridGradient::TouchedRows(uint32_t level) const {
  uint64_t count = 0;
  for (uint64_t word : bits_[level]) count += std::popcount(word);
  return count;
}

template <bool kClear>
void GridGradient::ExtractImpl(uint32_t level, SparseRows* out) {
  const uint32_t F = layout_->features();
  float* grad = grad_.data() + layout_->level(level).row_offset * F;
  out->width = F;
  auto& bits = bits_[level];
  const size_t first = out->rows.size();
  const uint64_t count = TouchedRows(level);
  out->rows.resize(first + count);
  out->values.resize((first + count) * F);
  // Pass 1: row ids from the bitmap (sequential). Pass 2: gather with the
  // ids known ahead, so the scattered gradient rows can be prefetched.
  uint32_t* rows = out->rows.data() + first;
  WriteSetBits(bits.data(), bits.size(), 0, rows, rows + count);
  if constexpr (kClear) std::fill(bits.begin(), bits.end(), 0);
  float* values = out->values.data() + first * F;
  if (compact_) {  // the values are in row order already
    if (count > 0) std::memcpy(values, compact_values_[level].data(), count * F * sizeof(float));
    return;
  }
  // The width as a constant: memcpy and memset of a run-time width were a
  // libc call per row of 8 bytes (perf: 5.6% of a ps run's samples in
  // memmove under this loop).
  WithRowWidth(F, [&](auto constant) {
    const uint32_t w = RowWidth(constant, F);
    for (size_t i = 0; i < count; ++i) {
      if (i + kPrefetchRows < count)
        __builtin_prefetch(grad + size_t{rows[i + kPrefetchRows]} * w, 1);
      float* g = grad + size_t{rows[i]} * w;
      float* v = values + i * w;
      for (uint32_t f = 0; f < w; ++f) v[f] = g[f];
      if constexpr (kClear) {
        for (uint32_t f = 0; f < w; ++f) g[f] = 0.0f;
      }
    }
  });
}

void GridGradient::Extract(uint32_t level, SparseRows* out) const {
  const_cast<GridGradient*>(this)->ExtractImpl<false>(level, out);
}

void GridGradient::Take(uint32_t level, SparseRows* out) { ExtractImpl<true>(level, out); }

void GridGradient::Clear(ThreadPool* pool) {
  if (compact_) {  // nothing in the dense buffer
    ForgetTouched();
    compact_ = false;
    return;
  }
  const uint32_t F = layout_->features();
  pool->ParallelFor(layout_->n_levels(), [&](size_t l) {
    float* grad = grad_.data() + layout_->level(static_cast<uint32_t>(l)).row_offset * F;
    for (size_t w = 0; w < bits_[l].size(); ++w) {
      for (uint64_t word = bits_[l][w]; word != 0; word &= word - 1) {
        const size_t row = w * 64 + std::countr_zero(word);
        std::memset(grad + row * F, 0, F * sizeof(float));
      }
      bits_[l][w] = 0;
    }
  });
}

void GridGradient::TakeRowIds(uint32_t level, uint64_t begin, uint64_t end,
                              std::vector<uint32_t>* rows) {
  auto& bits = bits_[level];
  GRIDSYNC_CHECK_EQ(begin % 64, 0u);
  GRIDSYNC_CHECK_LE(begin, end);
  GRIDSYNC_CHECK_LE(end, layout_->level(level).rows);
  GRIDSYNC_CHECK(end % 64 == 0 || end == layout_->level(level).rows);
  // A range ends on a word boundary or at the level's last row, so whole
  // words are taken (the level's last word has no bits past its rows).
  const size_t first = begin / 64;
  const size_t last = (end + 63) / 64;
  TakeSetBits(bits.data() + first, last - first, static_cast<uint32_t>(first * 64), rows);
}

void GridGradient::AddRows(uint32_t level, const uint32_t* rows, size_t n, const float* values) {
  CheckDense();
  const uint32_t F = layout_->features();
  float* grad = grad_.data() + layout_->level(level).row_offset * F;
  auto& bits = bits_[level];
  for (size_t i = 0; i < n; ++i) {
    const uint32_t row = rows[i];
    float* dst = grad + size_t{row} * F;
    for (uint32_t f = 0; f < F; ++f) dst[f] += values[i * F + f];
    bits[row / 64] |= uint64_t{1} << (row % 64);
  }
}

void GridGradient::MarkRows(uint32_t level, const uint32_t* rows, size_t n) {
  CheckDense();
  SetRowBits(rows, n, bits_[level].data());
}

void GridGradient::ForgetTouched() {
  for (auto& bits : bits_) std::fill(bits.begin(), bits.end(), 0);
}

void GridGradient::AddFrom(GridGradient* other, ThreadPool* pool) {
  CheckDense();
  other->CheckDense();
  const uint32_t F = layout_->features();
  pool->ParallelFor(layout_->n_levels(), [&](size_t l) {
    const size_t offset = layout_->level(static_cast<uint32_t>(l)).row_offset * F;
    float* dst = grad_.data() + offset;
    float* src = other->grad_.data() + offset;
    auto& src_bits = other->bits_[l];
    auto& dst_bits = bits_[l];
    for (size_t w = 0; w < src_bits.size(); ++w) {
      for (uint64_t word = src_bits[w]; word != 0; word &= word - 1) {
        const size_t row = w * 64 + std::countr_zero(word);
        for (uint32_t f = 0; f < F; ++f) {
          dst[row * F + f] += src[row * F + f];
          src[row * F + f] = 0.0f;
        }
      }
      dst_bits[w] |= src_bits[w];
      src_bits[w] = 0;
    }
  });
}

GridRowSet::GridRowSet(const HashGridLayout& layout) : layout_(&layout) {
  for (const auto& level : layout.levels()) bits_.emplace_back((level.rows + 63) / 64, 0);
  rows_.resize(layout.n_levels());
}

void GridRowSet::Assign(const GridBatchLookup& lookup, ThreadPool* pool) {
  pool->ParallelFor(layout_->n_levels(), [&](size_t l) {
    auto& rows = rows_[l];
    rows.clear();
    if (l >= lookup.active_levels) return;
    auto& bits = bits_[l];
    SetRowBits(&lookup.rows[lookup.Index(static_cast<uint32_t>(l), 0)], lookup.n * lookup.corners,
               bits.data());
    TakeSetBits(bits.data(), bits.size(), 0, &rows);
  });
}

uint64_t GridRowSet::total() const {
  uint64_t n = 0;
  for (const auto& r : rows_) n += r.size();
  return n;
}

}  // namespace gridsync::cpu
