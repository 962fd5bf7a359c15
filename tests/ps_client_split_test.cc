// PsClient's split of a push among shards (ps_internal::SplitAll) with the
// caller's vectors offered (TableRowsRef::give_*): a table that goes to one
// shard whole takes them as its block's rows and values (zero copy); any
// other ref leaves them as they were. Either way every shard gets exactly
// the blocks a copying split makes.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/cluster_map.h"
#include "common/sharding.h"
#include "worker/ps_client.h"
#include "worker/ps_client_internal.h"

namespace gridsync {
namespace {

using Split = std::vector<std::vector<wire::OutBlock>>;

Partition Make(uint64_t rows, uint32_t width, uint32_t shards, ModelParallelDim dim) {
  auto made = Partition::Make({{"level", rows, width}, {"mlp", 8, 4}}, shards, dim);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  return std::move(made).value();
}

void ExpectSameBlocks(const Split& got, const Split& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < got.size(); ++s) {
    ASSERT_EQ(got[s].size(), want[s].size()) << "shard " << s;
    for (size_t b = 0; b < got[s].size(); ++b) {
      const wire::OutBlock& g = got[s][b];
      const wire::OutBlock& w = want[s][b];
      SCOPED_TRACE("shard " + std::to_string(s) + " block " + std::to_string(b));
      EXPECT_EQ(g.table, w.table);
      EXPECT_EQ(g.dense, w.dense);
      EXPECT_EQ(g.row_begin, w.row_begin);
      EXPECT_EQ(g.col_begin, w.col_begin);
      EXPECT_EQ(g.width, w.width);
      EXPECT_EQ(g.row_count, w.row_count);
      EXPECT_EQ(g.rows, w.rows);
      EXPECT_EQ(g.values, w.values);
    }
  }
}

struct Push {
  std::vector<uint32_t> rows;
  UninitVector<float> values;  // what a push block's values are
  UninitVector<float> mlp;
};

// Every 3rd row from `first`, `n` rows, with values distinct per element;
// the vectors are one element longer than needed, as a reused buffer may be.
Push MakePush(const Partition& partition, uint32_t first, uint32_t n) {
  Push p;
  const uint32_t width = partition.table(0).width;
  for (uint32_t i = 0; i < n; ++i) p.rows.push_back(first + 3 * i);
  for (uint32_t i = 0; i < n * width; ++i) p.values.push_back(0.25f * static_cast<float>(i) + 1);
  p.values.push_back(-1.0f);
  for (uint32_t i = 0; i < 8 * 4; ++i) p.mlp.push_back(static_cast<float>(i) - 3.5f);
  return p;
}

std::vector<TableRowsRef> Refs(Push* p, uint32_t n, bool give) {
  return {{0, false, p->rows.data(), n, p->values.data(), false, give ? &p->rows : nullptr,
           give ? &p->values : nullptr},
          {1, true, nullptr, 0, p->mlp.data(), false, nullptr, give ? &p->mlp : nullptr}};
}

TEST(PsClientSplitTest, OneShardTakesTheOfferedVectors) {
  const Partition partition = Make(20000, 2, 1, ModelParallelDim::kRow);
  Push copy = MakePush(partition, 5, 5000), given = copy;
  const Split want = ps_internal::SplitAll(partition, Refs(&copy, 5000, false), true);
  const Split got = ps_internal::SplitAll(partition, Refs(&given, 5000, true), true);
  ExpectSameBlocks(got, want);
  EXPECT_TRUE(given.rows.empty()) << "taken";
  EXPECT_TRUE(given.values.empty()) << "taken";
  EXPECT_TRUE(given.mlp.empty()) << "taken (dense)";
  EXPECT_TRUE(want[0][1].dense);
}

TEST(PsClientSplitTest, RowsOfOneOwnerAmongSeveralShardsAreTakenToo) {
  // 2 shards by rows, blocks of kRowBlock rows: rows inside the first
  // block all belong to one shard.
  const Partition partition = Make(4 * kRowBlock, 2, 2, ModelParallelDim::kRow);
  Push copy = MakePush(partition, 1, kRowBlock / 3 - 1), given = copy;
  const uint32_t n = static_cast<uint32_t>(copy.rows.size());
  const Split want = ps_internal::SplitAll(partition, Refs(&copy, n, false), true);
  const Split got = ps_internal::SplitAll(partition, Refs(&given, n, true), true);
  ExpectSameBlocks(got, want);
  EXPECT_TRUE(given.rows.empty());
  EXPECT_TRUE(given.values.empty());
}

TEST(PsClientSplitTest, RowsSpreadOverShardsOrColumnsSplitAreCopied) {
  for (ModelParallelDim dim : {ModelParallelDim::kRow, ModelParallelDim::kColumn}) {
    SCOPED_TRACE(dim == ModelParallelDim::kRow ? "rows" : "columns");
    const Partition partition = Make(4 * kRowBlock, 2, 2, dim);
    // Rows over all four row blocks: both shards own some (rows), or
    // every row is cut between the shards (columns).
    Push copy = MakePush(partition, 2, 4 * kRowBlock / 3 - 1), given = copy;
    const uint32_t n = static_cast<uint32_t>(copy.rows.size());
    const Split want = ps_internal::SplitAll(partition, Refs(&copy, n, false), true);
    const Split got = ps_internal::SplitAll(partition, Refs(&given, n, true), true);
    ExpectSameBlocks(got, want);
    EXPECT_EQ(given.rows, copy.rows) << "left as it was";
    EXPECT_EQ(given.values, copy.values) << "left as it was";
  }
}

TEST(PsClientSplitTest, VectorsThatDoNotHoldTheRefAreNotTaken) {
  const Partition partition = Make(20000, 2, 1, ModelParallelDim::kRow);
  Push copy = MakePush(partition, 0, 100), given = copy;
  UninitVector<float> other = given.values;  // offered, but not what values points at
  std::vector<TableRowsRef> refs = Refs(&given, 100, true);
  refs[0].give_values = &other;
  const Split got = ps_internal::SplitAll(partition, refs, true);
  ExpectSameBlocks(got, ps_internal::SplitAll(partition, Refs(&copy, 100, false), true));
  EXPECT_EQ(other, copy.values) << "not taken";
  EXPECT_EQ(given.rows, copy.rows) << "rows not taken without their values";
}

}  // namespace
}  // namespace gridsync
