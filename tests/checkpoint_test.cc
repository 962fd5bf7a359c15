// Shard checkpoints (server/shard_checkpoint.h): a partition's state round
// trips exactly; a step is complete only when every shard's manifest exists;
// a crash mid-write (a .tmp file) leaves the previous step in use; corrupted
// or mismatched data is refused naming the file. The multi-process fault
// test (kill a shard, resume) is tests/fault_test.sh.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/sharding.h"
#include "server/shard_checkpoint.h"
#include "server/shard_store.h"
#include "tests/test_util.h"

namespace gridsync {
namespace {

namespace fs = std::filesystem;

struct Fixture {
  Config config = testing::SmallDistributedConfig(1, GradientSyncMode::kPs, 4);
  std::vector<TableInfo> tables = testing::SpecOf(config).model.tables;
  Partition partition = *Partition::Make(tables, 2, ModelParallelDim::kRow);
  AdamHyper hyper;
};

// A store whose parameters and Adam state moved: a dense push of ramps.
void Train(ShardStore& store, const Partition& partition, float scale) {
  for (uint32_t t = 0; t < partition.n_tables(); ++t) {
    // Rows of this shard: the first block of table t it owns, if any.
    std::vector<uint32_t> rows;
    for (uint32_t r = 0; r < partition.table(t).rows && rows.size() < 8; ++r) {
      if (partition.Owner(t, r, partition.ColumnGroupOf(store.shard(), t)) == store.shard())
        rows.push_back(r);
    }
    if (rows.empty()) continue;
    const uint32_t w = store.table_width(t);
    std::vector<float> values(rows.size() * w);
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = scale * static_cast<float>(i + 1) / 100.0f;
    wire::Block block;
    block.table = t;
    block.row_count = static_cast<uint32_t>(rows.size());
    block.width = w;
    block.col_begin = partition.ColBegin(t, partition.ColumnGroupOf(store.shard(), t));
    block.rows = rows;
    block.values = values;
    store.PrepareStep();
    store.ApplyDirect(block, 0, rows.size());
  }
}

TEST(CheckpointTest, StateRoundTripsExactlyAndStepsNeedEveryShard) {
  Fixture f;
  const std::string dir =
      (fs::temp_directory_path() / ("gridsync-ckpt-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  ShardStore a(f.partition, 0, f.hyper), b(f.partition, 1, f.hyper);
  Train(a, f.partition, 1.0f);
  Train(b, f.partition, 2.0f);
  ASSERT_TRUE(WriteShardCheckpoint(dir, 0, 50, a).ok());
  EXPECT_EQ(LatestCompleteCheckpoint(dir, 2), 0u) << "shard 1 has not written step 50";
  ASSERT_TRUE(WriteShardCheckpoint(dir, 1, 50, b).ok());
  EXPECT_EQ(LatestCompleteCheckpoint(dir, 2), 50u);

  // A crash while writing step 100: a temporary file, no manifest.
  fs::create_directories(dir + "/step-100");
  std::ofstream(dir + "/step-100/shard-0.bin.tmp") << "half written";
  EXPECT_EQ(LatestCompleteCheckpoint(dir, 2), 50u);

  ShardStore restored(f.partition, 0, f.hyper);
  ASSERT_TRUE(LoadShardCheckpoint(dir, 0, 50, &restored).ok());
  std::string want, got;
  a.AppendState(&want);
  restored.AppendState(&got);
  EXPECT_EQ(got, want);
  // Both continue identically.
  Train(a, f.partition, 3.0f);
  Train(restored, f.partition, 3.0f);
  want.clear();
  got.clear();
  a.AppendState(&want);
  restored.AppendState(&got);
  EXPECT_EQ(got, want);

  // The wrong shard's file, and corrupted bytes, are refused.
  EXPECT_FALSE(LoadShardCheckpoint(dir, 0, 77, &restored).ok());
  {
    std::fstream file(dir + "/step-50/shard-1.bin",
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(10);
    file.put('\x7f');
  }
  ShardStore other(f.partition, 1, f.hyper);
  const Status corrupt = LoadShardCheckpoint(dir, 1, 50, &other);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_NE(corrupt.message().find("checksum"), std::string::npos) << corrupt.ToString();
  EXPECT_NE(corrupt.message().find("shard-1.bin"), std::string::npos) << corrupt.ToString();

  // Only the two newest checkpoints of a shard are kept.
  ASSERT_TRUE(WriteShardCheckpoint(dir, 0, 150, a).ok());
  ASSERT_TRUE(WriteShardCheckpoint(dir, 0, 200, a).ok());
  EXPECT_FALSE(fs::exists(dir + "/step-50/shard-0.bin"));
  EXPECT_TRUE(fs::exists(dir + "/step-200/shard-0.json"));
  fs::remove_all(dir);
}

TEST(CheckpointTest, RefusedWhereTheShardsDoNotHoldTheWholeState) {
  for (const char* extra :
       {R"("compression": {"codec": "onebit"})", R"("ps": {"consistency": "async"})",
        R"("ps": {"optimizer": "worker"})"}) {
    auto c = Config::Parse(std::string(R"({"distributed": {"enable": true, "gradient_sync": "ps"},
        "checkpoint": {"every_steps": 10}, )") +
                               extra + "}",
                           "ckpt");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const Status runnable = c->CheckRunnable(false);
    EXPECT_EQ(runnable.code(), StatusCode::kUnsupported) << extra;
    EXPECT_NE(runnable.message().find("checkpoint.every_steps"), std::string::npos)
        << runnable.ToString();
  }
  auto plain = Config::Parse(R"({"distributed": {"enable": true, "gradient_sync": "ps"},
      "checkpoint": {"every_steps": 10}, "task": {"output": "/tmp/x"}})",
                             "ckpt");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->CheckRunnable(false).ok());
  EXPECT_EQ(plain->checkpoint.dir, "/tmp/x/checkpoints");
}

}  // namespace
}  // namespace gridsync
