// The parameter rows of a model laid end to end: grid rows (all levels),
// then the rows of each MLP table. "Global row" g maps to (table, row) and
// to an element offset in the packed gradient buffer. Hybrid sync cuts this
// space into one contiguous slice per local rank.
//
// Thread safety: immutable after construction.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "worker/model.h"

namespace gridsync {

class RowSpace {
 public:
  struct Table {
    uint64_t first_row;  // global row of its row 0
    uint64_t rows;
    uint32_t width;
    uint64_t first_element;
  };

  explicit RowSpace(const HashGridModel& model) {
    const auto& layout = model.layout();
    for (uint32_t l = 0; l < layout.n_levels(); ++l) {
      tables_.push_back({first_row_, layout.level(l).rows, layout.features(), elements_});
      first_row_ += layout.level(l).rows;
      elements_ += uint64_t{layout.level(l).rows} * layout.features();
    }
    for (const auto& m : model.mlp_weights()) {
      const uint64_t rows = static_cast<uint64_t>(m.cols());
      tables_.push_back({first_row_, rows, static_cast<uint32_t>(m.rows()), elements_});
      first_row_ += rows;
      elements_ += static_cast<uint64_t>(m.size());
    }
  }

  uint64_t rows() const { return first_row_; }
  uint64_t elements() const { return elements_; }
  const std::vector<Table>& tables() const { return tables_; }
  uint32_t TableOf(uint64_t global_row) const {
    // The last table starting at or before the row (a linear scan over the
    // 19 tables of a 16-level model, five times per row, was most of
    // hybrid's host time per step).
    const auto after = std::upper_bound(tables_.begin() + 1, tables_.end(), global_row,
                                        [](uint64_t g, const Table& t) { return g < t.first_row; });
    return static_cast<uint32_t>(after - tables_.begin() - 1);
  }
  // TableOf for a walk over ascending rows: amortised O(1) per row (a row
  // below the last one asked falls back to the search).
  class Cursor {
   public:
    explicit Cursor(const RowSpace& space) : space_(&space) {}
    uint32_t TableOf(uint64_t global_row) {
      const auto& tables = space_->tables_;
      if (global_row < tables[table_].first_row) {
        table_ = space_->TableOf(global_row);
        return table_;
      }
      while (table_ + 1 < tables.size() && tables[table_ + 1].first_row <= global_row) ++table_;
      return table_;
    }

   private:
    const RowSpace* space_;
    uint32_t table_ = 0;
  };
  // The element offset of a global row; rows() maps to elements().
  uint64_t ElementOf(uint64_t global_row) const {
    if (global_row >= first_row_) return elements_;
    const auto& t = tables_[TableOf(global_row)];
    return t.first_element + (global_row - t.first_row) * t.width;
  }
  // Cuts the rows into `parts` contiguous ranges of near-equal elements:
  // parts + 1 bounds, the first 0 and the last rows().
  std::vector<uint64_t> SliceRows(int parts) const {
    std::vector<uint64_t> bounds = {0};
    uint64_t row = 0;
    for (int p = 1; p < parts; ++p) {
      const uint64_t target = elements_ * static_cast<uint64_t>(p) / static_cast<uint64_t>(parts);
      while (row < first_row_ && ElementOf(row) < target) {
        // Skip whole tables quickly, then single rows.
        const auto& t = tables_[TableOf(row)];
        const uint64_t table_end_element = t.first_element + t.rows * t.width;
        if (table_end_element <= target) {
          row = t.first_row + t.rows;
        } else {
          row = t.first_row + (target - t.first_element + t.width - 1) / t.width;
          break;
        }
      }
      bounds.push_back(std::min(row, first_row_));
    }
    bounds.push_back(first_row_);
    return bounds;
  }

 private:
  std::vector<Table> tables_;
  uint64_t first_row_ = 0;
  uint64_t elements_ = 0;
};

}  // namespace gridsync
