// The partition function: every row has exactly one owner per column group,
// local rows are unique, and shards are balanced within 5% of the mean.
#include "common/sharding.h"

#include <gtest/gtest.h>

#include <set>

#include "common/config.h"
#include "spec/run_spec.h"

namespace gridsync {
namespace {

std::vector<TableInfo> SeedTables(int log2_size) {
  Config config;
  config.encoding.log2_hashmap_size = log2_size;
  auto spec = RunSpec::Resolve(config);
  EXPECT_TRUE(spec.ok());
  return spec->model.tables;
}

TEST(ShardingTest, SeedConfigsBalanceWithinFivePercent) {
  for (int log2_size : {19, 21, 22}) {
    const auto tables = SeedTables(log2_size);
    for (ModelParallelDim dim : {ModelParallelDim::kRow, ModelParallelDim::kColumn, ModelParallelDim::kBoth}) {
      for (uint32_t shards : {1u, 2u, 3u, 4u, 8u}) {
        if (dim == ModelParallelDim::kColumn && shards > 2) continue;  // width 2 splits at most in 2
        auto p = Partition::Make(tables, shards, dim);
        ASSERT_TRUE(p.ok());
        uint64_t total = 0;
        for (uint32_t s = 0; s < shards; ++s) total += p->OwnedValues(s);
        uint64_t expected = 0;
        for (const auto& t : tables) expected += t.rows * t.width;
        EXPECT_EQ(total, expected);
        const double mean = static_cast<double>(total) / shards;
        for (uint32_t s = 0; s < shards; ++s) {
          EXPECT_NEAR(static_cast<double>(p->OwnedValues(s)), mean, 0.05 * mean)
              << "log2 " << log2_size << " dim " << ToString(dim) << " shards " << shards << " shard " << s;
        }
      }
    }
  }
}

TEST(ShardingTest, EveryRowHasOneOwnerAndUniqueLocalSlot) {
  const std::vector<TableInfo> tables = {{"a", 10000, 2}, {"b", 300, 4}, {"c", 64, 3}, {"d", 9000, 2}};
  for (ModelParallelDim dim : {ModelParallelDim::kRow, ModelParallelDim::kColumn, ModelParallelDim::kBoth}) {
    for (uint32_t shards : {1u, 2u, 3u, 4u}) {
      auto p = Partition::Make(tables, shards, dim);
      ASSERT_TRUE(p.ok());
      for (uint32_t t = 0; t < tables.size(); ++t) {
        const uint32_t groups = p->ColumnGroups(t);
        EXPECT_EQ(groups * p->RowGroups(t), shards);
        EXPECT_EQ(p->ColWidth(t) * groups, tables[t].width);
        std::vector<std::set<uint64_t>> slots(shards);
        std::vector<uint64_t> counted(shards, 0);
        for (uint32_t g = 0; g < groups; ++g) {
          for (uint32_t row = 0; row < tables[t].rows; ++row) {
            const uint32_t owner = p->Owner(t, row, g);
            ASSERT_LT(owner, shards);
            ASSERT_EQ(p->ColumnGroupOf(owner, t), g);
            const uint64_t local = p->LocalRow(t, row);
            ASSERT_LT(local, p->LocalRows(owner, t)) << "table " << t << " row " << row;
            ASSERT_TRUE(slots[owner].insert(local).second) << "two rows share a slot";
            ++counted[owner];
          }
        }
        for (uint32_t s = 0; s < shards; ++s) EXPECT_EQ(counted[s], p->OwnedRows(s, t));
      }
    }
  }
}

// LocalRow divides by the row groups with a multiply (Partition::
// DivideByRowGroups): it must equal the division for every shard count the
// config allows and every 32-bit row, the largest included.
std::vector<uint32_t> ShardCountsToCheck() {
  std::vector<uint32_t> counts;
  for (uint32_t shards = 1; shards <= 1024; ++shards) counts.push_back(shards);
  for (uint32_t shards : {4093u, 32768u, 65521u, Partition::kMaxShards}) counts.push_back(shards);
  return counts;
}

TEST(ShardingTest, LocalRowIsTheDivisionForEveryShardCount) {
  const std::vector<TableInfo> tables = {{"huge", UINT32_MAX, 1}};
  for (uint32_t shards : ShardCountsToCheck()) {
    auto p = Partition::Make(tables, shards, ModelParallelDim::kRow);
    ASSERT_TRUE(p.ok());
    ASSERT_EQ(p->RowGroups(0), shards);
    const uint32_t last_block = UINT32_MAX / kRowBlock;
    for (uint64_t block : {uint64_t{0}, uint64_t{1}, uint64_t{shards - 1}, uint64_t{shards},
                           uint64_t{shards + 1}, uint64_t{2 * shards - 1}, uint64_t{last_block / 3},
                           uint64_t{last_block - 1}, uint64_t{last_block}}) {
      if (block > last_block) continue;
      for (uint64_t offset : {uint64_t{0}, uint64_t{kRowBlock - 1}}) {
        const auto row = static_cast<uint32_t>(block * kRowBlock + offset);
        ASSERT_EQ(p->LocalRow(0, row), block / shards * kRowBlock + offset)
            << shards << " shards, row " << row;
      }
    }
    for (uint32_t block = 0; block <= last_block; block += 4093 + shards % 7) {
      ASSERT_EQ(p->LocalRow(0, block * kRowBlock), uint64_t{block / shards} * kRowBlock)
          << shards << " shards, block " << block;
    }
  }
}

TEST(ShardingTest, RefusesShardCountsOutOfRange) {
  const std::vector<TableInfo> tables = {{"a", 100, 2}};
  for (uint32_t shards : {0u, Partition::kMaxShards + 1}) {
    auto p = Partition::Make(tables, shards, ModelParallelDim::kRow);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("allowed: 1..65536"), std::string::npos)
        << p.status().ToString();
  }
}

TEST(ShardingTest, ColumnModeSplitsFeatures) {
  const std::vector<TableInfo> tables = {{"grid", 8192, 2}, {"mlp", 64, 3}};
  auto p = Partition::Make(tables, 2, ModelParallelDim::kColumn);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ColumnGroups(0), 2u);
  EXPECT_EQ(p->ColWidth(0), 1u);
  EXPECT_EQ(p->Owner(0, 5, 0), 0u);
  EXPECT_EQ(p->Owner(0, 5, 1), 1u);
  // Width 3 does not split in 2: that table falls back to rows.
  EXPECT_EQ(p->ColumnGroups(1), 1u);
  EXPECT_EQ(p->ColWidth(1), 3u);
}

TEST(ShardingTest, DeterministicRoundRobinOfBlocks) {
  const std::vector<TableInfo> tables = {{"a", 3 * kRowBlock, 1}, {"b", 2 * kRowBlock, 1}};
  auto p = Partition::Make(tables, 2, ModelParallelDim::kRow);
  ASSERT_TRUE(p.ok());
  // Blocks dealt in order across tables: a0->0 a1->1 a2->0 b0->1 b1->0.
  EXPECT_EQ(p->Owner(0, 0, 0), 0u);
  EXPECT_EQ(p->Owner(0, kRowBlock, 0), 1u);
  EXPECT_EQ(p->Owner(0, 2 * kRowBlock, 0), 0u);
  EXPECT_EQ(p->Owner(1, 0, 0), 1u);
  EXPECT_EQ(p->Owner(1, kRowBlock + 7, 0), 0u);
  EXPECT_FALSE(Partition::Make(tables, 0, ModelParallelDim::kRow).ok());
}

}  // namespace
}  // namespace gridsync
