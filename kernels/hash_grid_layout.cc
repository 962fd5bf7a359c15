#include "kernels/hash_grid_layout.h"

#include <cmath>
#include <sstream>

namespace gridsync {

Result<HashGridLayout> HashGridLayout::Make(const HashGridSpec& spec) {
  if (spec.dims < 2 || spec.dims > kMaxGridDims)
    return Status::InvalidArgument("hash grid dims " + std::to_string(spec.dims) +
                                   "; allowed: 2 or 3");
  if (spec.n_levels < 1 || spec.n_levels > kMaxGridLevels)
    return Status::InvalidArgument("hash grid n_levels " + std::to_string(spec.n_levels) +
                                   "; allowed: 1..32");
  if (spec.features != 1 && spec.features != 2 && spec.features != 4 && spec.features != 8)
    return Status::InvalidArgument("hash grid features " + std::to_string(spec.features) +
                                   "; allowed: 1, 2, 4 or 8");
  if (spec.log2_hashmap_size < 3 || spec.log2_hashmap_size > 30)
    return Status::InvalidArgument("hash grid log2_hashmap_size " +
                                   std::to_string(spec.log2_hashmap_size) + "; allowed: 3..30");
  if (spec.base_resolution < 1 || !(spec.per_level_scale >= 1.0f) ||
      !std::isfinite(spec.per_level_scale))
    return Status::InvalidArgument(
        "hash grid base_resolution must be >= 1 and per_level_scale >= 1");

  HashGridLayout layout;
  layout.spec_ = spec;
  const uint64_t table = uint64_t{1} << spec.log2_hashmap_size;
  const float log2_scale = std::log2(spec.per_level_scale);
  uint64_t offset = 0;
  for (uint32_t l = 0; l < spec.n_levels; ++l) {
    GridLevelInfo info;
    info.scale = GridLevelScale(l, log2_scale, static_cast<float>(spec.base_resolution));
    if (!(info.scale < 65535.0f))
      return Status::InvalidArgument("hash grid level " + std::to_string(l) + " has scale " +
                                     std::to_string(info.scale) +
                                     "; allowed: below 65535 (a level's scale is base_resolution "
                                     "x per_level_scale^level: lower base_resolution, "
                                     "per_level_scale or n_levels)");
    info.resolution = GridLevelResolution(info.scale);
    double dense_rows = std::pow(static_cast<double>(info.resolution), spec.dims);
    if (dense_rows <= static_cast<double>(table)) {
      const uint64_t rows = static_cast<uint64_t>(dense_rows);
      info.rows = static_cast<uint32_t>((rows + 7) / 8 * 8);
      info.hashed = 0;
    } else {
      info.rows = static_cast<uint32_t>(table);
      info.hashed = 1;
    }
    info.row_offset = offset;
    offset += info.rows;
    layout.levels_.push_back(info);
  }
  layout.total_rows_ = offset;
  return layout;
}

std::string HashGridLayout::Describe() const {
  std::ostringstream out;
  for (uint32_t l = 0; l < n_levels(); ++l) {
    const auto& lv = levels_[l];
    out << "level " << l << ": scale " << lv.scale << " res " << lv.resolution << " rows "
        << lv.rows << (lv.hashed ? " hashed" : " dense") << "\n";
  }
  return out.str();
}

}  // namespace gridsync
