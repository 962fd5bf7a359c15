// SparseRows: the unit of gradient and parameter exchange. A set of rows of
// one table, ascending row ids, with `width` floats per row packed in the
// same order. A dense table is simply every row.
//
// Thread safety: a plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/uninit_vector.h"

namespace gridsync {

struct SparseRows {
  uint32_t width = 0;
  std::vector<uint32_t> rows;
  // rows.size() * width. Uninitialised on resize: every producer writes
  // it whole, and a push may hand it to its message (a frame's values).
  UninitVector<float> values;

  size_t size() const { return rows.size(); }
  void clear() {
    rows.clear();
    values.clear();
  }
};

}  // namespace gridsync
