#include "common/sharding.h"

#include <numeric>
#include <string>

namespace gridsync {

uint32_t Partition::ColumnGroupsFor(uint32_t width, uint32_t shards, ModelParallelDim dim) {
  uint32_t groups = 1;
  if (dim == ModelParallelDim::kColumn) {
    groups = shards;
  } else if (dim == ModelParallelDim::kBoth) {
    groups = std::gcd(width, shards);
  }
  return groups == 0 || width % groups != 0 ? 1 : groups;
}

Result<Partition> Partition::Make(const std::vector<TableInfo>& tables, uint32_t shards,
                                  ModelParallelDim dim) {
  if (shards == 0 || shards > kMaxShards)
    return Status::InvalidArgument("ps.shards is " + std::to_string(shards) + "; allowed: 1.." +
                                   std::to_string(kMaxShards));
  Partition p;
  p.shards_ = shards;
  p.tables_ = tables;
  uint64_t block = 0;
  for (const auto& t : tables) {
    if (t.width == 0) return Status::InvalidArgument("table " + t.name + " has width 0");
    if (t.rows > UINT32_MAX)
      return Status::InvalidArgument("table " + t.name + " has more than 2^32 rows");
    const uint32_t groups = ColumnGroupsFor(t.width, shards, dim);
    const uint32_t row_groups = shards / groups;
    p.per_table_.push_back(
        {block, groups, row_groups, (uint64_t{1} << kInverseShift) / row_groups + 1});
    block += (t.rows + kRowBlock - 1) / kRowBlock;
  }
  return p;
}

uint64_t Partition::OwnedRows(uint32_t shard, uint32_t t) const {
  const uint64_t rows = tables_[t].rows;
  const uint64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  const uint32_t r = RowGroups(t);
  const uint32_t rg = shard % r;
  uint64_t owned = 0;
  // First block b with (first_block + b) % r == rg, then every r-th block.
  const uint64_t first = (rg + r - per_table_[t].first_block % r) % r;
  for (uint64_t b = first; b < blocks; b += r)
    owned += std::min<uint64_t>(kRowBlock, rows - b * kRowBlock);
  return owned;
}

uint64_t Partition::LocalRows(uint32_t shard, uint32_t t) const {
  const uint64_t blocks = (tables_[t].rows + kRowBlock - 1) / kRowBlock;
  const uint32_t r = RowGroups(t);
  const uint64_t first = (shard % r + r - per_table_[t].first_block % r) % r;
  if (first >= blocks) return 0;
  const uint64_t owned_blocks = (blocks - first + r - 1) / r;
  // Local index of the last owned block is (first + (owned_blocks-1)*r) / r.
  return ((first + (owned_blocks - 1) * r) / r + 1) * kRowBlock;
}

uint64_t Partition::OwnedValues(uint32_t shard) const {
  uint64_t values = 0;
  for (uint32_t t = 0; t < n_tables(); ++t) values += OwnedRows(shard, t) * ColWidth(t);
  return values;
}

}  // namespace gridsync
