// SparseRows: the unit of gradient and parameter exchange. A set of rows of
// one table, ascending row ids, with `width` floats per row packed in the
// same order. A dense table is simply every row.
//
// Thread safety: a plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gridsync {

struct SparseRows {
  uint32_t width = 0;
  std::vector<uint32_t> rows;
  std::vector<float> values;  // rows.size() * width

  size_t size() const { return rows.size(); }
  void clear() {
    rows.clear();
    values.clear();
  }
};

}  // namespace gridsync
