// The layout of a multiresolution hash grid: per-level resolution, size and
// placement of every level's table inside one concatenated parameter array
// of total_rows() x features floats (level-major, row-major inside a level).
//
// Each level is one table of the PS model ("parameters as tables of rows").
//
// Thread safety: immutable after Make(); share freely.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/hash_grid_math.h"

namespace gridsync {

struct HashGridSpec {
  uint32_t dims = 2;               // 2 (images) or 3 (volumes)
  uint32_t n_levels = 16;
  uint32_t features = 2;           // per level
  uint32_t log2_hashmap_size = 19;
  uint32_t base_resolution = 16;
  float per_level_scale = 1.5f;
};

class HashGridLayout {
 public:
  // Rejects specs outside what the kernels support (dims 2..3, 1..32 levels,
  // features 1/2/4/8, log2 size 3..30).
  static Result<HashGridLayout> Make(const HashGridSpec& spec);

  const HashGridSpec& spec() const { return spec_; }
  uint32_t n_levels() const { return spec_.n_levels; }
  uint32_t features() const { return spec_.features; }
  uint32_t output_width() const { return spec_.n_levels * spec_.features; }
  const GridLevelInfo& level(uint32_t l) const { return levels_[l]; }
  const std::vector<GridLevelInfo>& levels() const { return levels_; }
  uint64_t total_rows() const { return total_rows_; }
  uint64_t total_params() const { return total_rows_ * spec_.features; }

  std::string Describe() const;  // one line per level, for logs

 private:
  HashGridSpec spec_;
  std::vector<GridLevelInfo> levels_;
  uint64_t total_rows_ = 0;
};

}  // namespace gridsync
