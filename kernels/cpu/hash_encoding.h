// CPU kernels of the multiresolution hash encoding: forward, the lookup
// that tells which rows a batch reads, and the backward pass into a sparse
// gradient (per level: the rows touched and their values).
//
// Work is split across a ThreadPool (optional for the free functions): the
// lookup and the forward pass by (level, range of samples), each writing
// outputs of its own; the backward pass by level, so every row's gradient
// is summed in sample order whatever the thread count. Results are
// identical for 1 or N threads.
//
// Thread safety: the free functions are reentrant; a GridGradient must not
// be used from two calls at once, except TakeRowIds on disjoint ranges
// (and CompactValues beside them, which reads no bitmap).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/huge_pages.h"
#include "common/sparse_rows.h"
#include "common/thread_pool.h"
#include "kernels/hash_grid_layout.h"

namespace gridsync::cpu {

// The corner rows (level-local) and d-linear weights of every sample on every
// active level, computed once in the forward pass and reused by backward.
// They depend only on positions, so a worker can compute them before the
// forward pass and pull exactly these rows.
struct GridBatchLookup {
  size_t n = 0;
  uint32_t corners = 0;        // 2^dims
  uint32_t active_levels = 0;  // levels >= active_levels are switched off
  std::vector<uint32_t> rows;  // [level][sample][corner]
  std::vector<float> weights;  // [level][sample][corner]

  size_t Index(uint32_t level, size_t sample) const { return (level * n + sample) * corners; }
};

// Fills `lookup` for n positions (n x dims, in [0,1]).
void HashGridLookup(const HashGridLayout& layout, const float* positions, size_t n,
                    uint32_t active_levels, GridBatchLookup* lookup, ThreadPool* pool);

// features: n x output_width, sample-major, level-major inside a sample.
// Levels at or above lookup.active_levels output zeros.
void HashGridForward(const HashGridLayout& layout, const GridBatchLookup& lookup,
                     const float* params, float* features, ThreadPool* pool);
// The same reading an fp16 working copy of the parameters (mixed precision).
void HashGridForward(const HashGridLayout& layout, const GridBatchLookup& lookup,
                     const uint16_t* params_half, float* features, ThreadPool* pool);

// Accumulates the gradient of the grid parameters. It keeps a dense buffer
// and a touched-row bitmap per level, so that Extract returns rows in
// ascending order and Clear costs only what was touched.
//
// Or, for a caller that takes every row straight to Adam, a compact
// gradient (AccumulateCompact): each level's touched rows get consecutive
// slots in row order, their rank in the bitmap. A hashed level's 2^16
// touched rows of 2 floats then sum in 512 KiB, which stay in L2, where
// the dense buffer's scattered rows each miss to DRAM, and Adam reads the
// sums in order instead of a fifth scattered stream.
class GridGradient {
 public:
  explicit GridGradient(const HashGridLayout& layout);

  // d_features: n x output_width, as HashGridForward wrote features.
  void Accumulate(const GridBatchLookup& lookup, const float* d_features, ThreadPool* pool);

  // Accumulate into the compact gradient instead of the dense buffer: the
  // same sums, bit for bit (each row's products added in sample order to
  // zero). The gradient must hold nothing (new, or cleared: after taking
  // every row, call Clear). Until then it is read only through Extract,
  // Take (which copy the values in order), TakeRowIds, CompactValues and
  // TouchedRows: the dense buffer's readers and writers refuse it (a bug,
  // checked).
  void AccumulateCompact(const GridBatchLookup& lookup, const float* d_features, ThreadPool* pool);
  bool compact() const { return compact_; }
  // The compact gradient of `level`'s touched rows from row `begin` on (a
  // multiple of 64), in row order: row i of what TakeRowIds(level, begin,
  // ...) lists has its values at [i * features, (i + 1) * features).
  // nullptr for a level that no row of the batch touched.
  const float* CompactValues(uint32_t level, uint64_t begin) const;

  // The touched rows of `level` (level-local ids, ascending) and their
  // gradient, appended to *out (width = features).
  void Extract(uint32_t level, SparseRows* out) const;
  // Extract, then zero those rows and forget them: one pass instead of two.
  void Take(uint32_t level, SparseRows* out);
  uint64_t TouchedRows(uint32_t level) const;

  // The touched rows among the level's rows [begin, end) (level-local ids,
  // ascending) into *rows, and forgets them; their gradient stays in
  // dense() for the caller, which zeroes it (AdamUpdateIndexed does as it
  // applies it). begin is a multiple of 64, end one too or the level's row
  // count. Calls on disjoint ranges of one level may run concurrently (each
  // owns its words of the bitmap).
  void TakeRowIds(uint32_t level, uint64_t begin, uint64_t end, std::vector<uint32_t>* rows);

  // Adds n rows of `level` (level-local ids, values n x features) and marks
  // them touched: a gradient computed elsewhere (a GPU) joins this one.
  void AddRows(uint32_t level, const uint32_t* rows, size_t n, const float* values);

  // Marks n rows of `level` touched and adds nothing: rows whose gradient
  // is held elsewhere (the model's device, ModelGradients::grid_on_device).
  void MarkRows(uint32_t level, const uint32_t* rows, size_t n);

  // Zeroes touched rows and forgets them.
  void Clear(ThreadPool* pool);

  // this += other over other's touched rows, then clears other. Summing
  // separately accumulated parts in a fixed order is how a distributed step
  // reduces (0 + part_0 + part_1 + ...), so local gradient accumulation
  // does it the same way and the two agree bit for bit.
  void AddFrom(GridGradient* other, ThreadPool* pool);

  const float* dense() const {
    CheckDense();
    return grad_.data();
  }
  // The dense buffer for in-place collectives (all-reduce sums it across
  // workers). Afterwards the touched bitmap no longer describes it: callers
  // zero the buffer themselves and call ForgetTouched().
  float* mutable_dense() {
    CheckDense();
    return grad_.data();
  }
  std::span<float> dense_span() {
    CheckDense();
    return {grad_.data(), grad_.size()};
  }
  void ForgetTouched();

 private:
  template <bool kClear>
  void ExtractImpl(uint32_t level, SparseRows* out);
  // Readers and writers of the dense buffer: a compact gradient is not there.
  void CheckDense() const;

  const HashGridLayout* layout_;
  HugePageVector<float> grad_;               // total_rows x features (common/huge_pages.h)
  std::vector<std::vector<uint64_t>> bits_;  // per level: one bit per row
  // The compact gradient (AccumulateCompact), per level: the touched rows
  // before each bitmap word, and the touched rows' values in row order.
  bool compact_ = false;
  std::vector<std::vector<uint32_t>> rank_;
  std::vector<std::vector<float>> compact_values_;
};

// The distinct rows a batch reads, per level, ascending: what a worker pulls
// before the forward pass. Known from the lookup alone.
class GridRowSet {
 public:
  explicit GridRowSet(const HashGridLayout& layout);
  // Replaces the set with the rows `lookup` reads.
  void Assign(const GridBatchLookup& lookup, ThreadPool* pool);
  const std::vector<uint32_t>& rows(uint32_t level) const { return rows_[level]; }
  uint64_t total() const;

 private:
  const HashGridLayout* layout_;
  std::vector<std::vector<uint64_t>> bits_;
  std::vector<std::vector<uint32_t>> rows_;
};

}  // namespace gridsync::cpu
