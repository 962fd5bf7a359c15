// Which PS shard owns which part of which table: a documented, deterministic
// function that workers and shards compute identically from the cluster map.
//
// Rows are grouped in blocks of kRowBlock consecutive rows (short index lists,
// sequential memory on the shard). With S shards:
//   mp_dim row (default): G = 1 column group, R = S row groups.
//   mp_dim column: G = S column groups (each owns width/S columns of every
//     row, as the first seed article's parallelize_model slices features),
//     R = 1.
//   mp_dim both: G = gcd(width, S) column groups x R = S/G row groups.
// A table whose width is not a multiple of G keeps G_t = 1 and R_t = S.
// Block b of table t falls in row group
//   rg(t, b) = (first_block(t) + b) mod R_t,   first_block(t) = sum over
//   earlier tables of ceil(rows / kRowBlock),
// so blocks are dealt round-robin across all tables, which balances shards to
// within one block per table. Column group g of row group rg is shard
// g * R_t + rg. On its owner, a row is stored at local row
// (b / R_t) * kRowBlock + row % kRowBlock.
//
// Thread safety: immutable after Make(); share freely.
#pragma once

#include <cstdint>
#include <vector>

#include "common/cluster_map.h"
#include "common/config.h"
#include "common/status.h"

namespace gridsync {

inline constexpr uint32_t kRowBlock = 4096;

class Partition {
 public:
  static Result<Partition> Make(const std::vector<TableInfo>& tables, uint32_t shards,
                                ModelParallelDim dim);

  // The column groups G_t of a table `width` floats wide (the header's
  // rule): 1 where the table is split by rows alone.
  static uint32_t ColumnGroupsFor(uint32_t width, uint32_t shards, ModelParallelDim dim);

  // Make refuses more (the configs allow 256 a node).
  static constexpr uint32_t kMaxShards = 1u << 16;

  uint32_t shards() const { return shards_; }
  uint32_t n_tables() const { return static_cast<uint32_t>(tables_.size()); }
  const TableInfo& table(uint32_t t) const { return tables_[t]; }

  uint32_t ColumnGroups(uint32_t t) const { return per_table_[t].column_groups; }
  uint32_t RowGroups(uint32_t t) const { return per_table_[t].row_groups; }
  uint32_t ColBegin(uint32_t t, uint32_t g) const { return g * ColWidth(t); }
  uint32_t ColWidth(uint32_t t) const { return tables_[t].width / per_table_[t].column_groups; }

  uint32_t Owner(uint32_t t, uint32_t row, uint32_t column_group) const {
    const uint32_t r = RowGroups(t);
    return column_group * r +
           static_cast<uint32_t>((per_table_[t].first_block + row / kRowBlock) % r);
  }
  // The column group a shard serves for table t.
  uint32_t ColumnGroupOf(uint32_t shard, uint32_t t) const { return shard / RowGroups(t); }

  uint64_t LocalRow(uint32_t t, uint32_t row) const {
    const uint32_t block = row / kRowBlock;
    return uint64_t{DivideByRowGroups(per_table_[t], block)} * kRowBlock + row % kRowBlock;
  }
  // Rows of storage shard `shard` allocates for table t (whole blocks).
  uint64_t LocalRows(uint32_t shard, uint32_t t) const;
  // Rows of table t that shard `shard` owns (for balance reports).
  uint64_t OwnedRows(uint32_t shard, uint32_t t) const;
  // Parameters (rows x owned columns) over all tables.
  uint64_t OwnedValues(uint32_t shard) const;

 private:
  struct PerTable {
    uint64_t first_block = 0;
    uint32_t column_groups = 1;
    uint32_t row_groups = 1;  // shards / column_groups, kept to avoid a division per row
    // 2^44 / row_groups + 1: a row's block index n is below 2^20 (32-bit
    // rows, 4096 a block) and row_groups at most kMaxShards (2^16), so n / row_groups is
    // exactly (n * this) >> 44: the multiply's excess, under n / 2^44, stays
    // below 1 / row_groups. A shard-local row needs that quotient for every
    // row a shard touches, and a hardware division there cost ~15% of a
    // merged apply (perf, two shards).
    uint64_t row_groups_inverse = (uint64_t{1} << kInverseShift) + 1;
  };
  static constexpr uint32_t kInverseShift = 44;
  static uint32_t DivideByRowGroups(const PerTable& p, uint32_t block) {
    return static_cast<uint32_t>((block * p.row_groups_inverse) >> kInverseShift);
  }
  uint32_t shards_ = 1;
  std::vector<TableInfo> tables_;
  std::vector<PerTable> per_table_;
};

}  // namespace gridsync
