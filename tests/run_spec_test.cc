// RunSpec::Resolve's switches derived from several keys, which the
// binaries act on without looking at the keys again.
#include "spec/run_spec.h"

#include <gtest/gtest.h>

#include "common/config.h"
#include "tests/test_util.h"

namespace gridsync {
namespace {

TEST(RunSpecTest, OnlyWorkersThatTalkToShardsTuneTheirHeapForMessages) {
  struct Case {
    GradientSyncMode sync;
    bool enable;
    bool ps_messages;
  };
  for (const Case& c :
       {Case{GradientSyncMode::kPs, true, true}, Case{GradientSyncMode::kHybrid, true, true},
        Case{GradientSyncMode::kNccl, true, false}, Case{GradientSyncMode::kPs, false, false}}) {
    Config config = testing::SmallDistributedConfig(2, c.sync, 10);
    config.distributed.enable = c.enable;
    auto spec = RunSpec::Resolve(config);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    EXPECT_EQ(spec->sync.ps_messages, c.ps_messages)
        << "gradient_sync " << static_cast<int>(c.sync) << ", enable " << c.enable;
  }
}

// A model of few 4096-row blocks over more shards would leave shards that
// own nothing and serve every step: refused, naming the most shards that
// all own a value; nccl, which has no shards, is not refused.
TEST(RunSpecTest, ShardsThatWouldOwnNothingAreRefused) {
  Config config = testing::SmallDistributedConfig(2, GradientSyncMode::kPs, 10);
  // One level of 4 x 4 rows and an MLP of one hidden layer: 3 tables of
  // one block each.
  config.encoding.n_levels = 1;
  config.encoding.log2_hashmap_size = 4;
  config.encoding.base_resolution = 4;
  config.network.n_hidden_layers = 1;
  for (int shards : {1, 2, 3}) {
    config.ps.shards = shards;
    auto spec = RunSpec::Resolve(config);
    EXPECT_TRUE(spec.ok()) << shards << " shards: " << spec.status().ToString();
  }
  for (GradientSyncMode sync : {GradientSyncMode::kPs, GradientSyncMode::kHybrid}) {
    config.distributed.gradient_sync = sync;
    config.ps.shards = 5;
    auto spec = RunSpec::Resolve(config);
    ASSERT_FALSE(spec.ok());
    const std::string& message = spec.status().message();
    EXPECT_NE(message.find("ps.shards 5: 2 of the shards would own no value"), std::string::npos)
        << message;
    EXPECT_NE(message.find("3 tables in 3 blocks"), std::string::npos) << message;
    EXPECT_NE(message.find("allowed: ps.shards at most 3"), std::string::npos) << message;
  }
  config.distributed.gradient_sync = GradientSyncMode::kNccl;
  EXPECT_TRUE(RunSpec::Resolve(config).ok());
  // Nor without distributed.enable, where no shard runs.
  config.distributed.gradient_sync = GradientSyncMode::kPs;
  config.distributed.enable = false;
  EXPECT_TRUE(RunSpec::Resolve(config).ok());
  config.distributed.enable = true;
  // Split by columns, every shard owns columns of a table whose width the
  // shard count divides (the first MLP matrix, 32 wide, over 4 shards),
  // however few its blocks: 4 shards pass there and are refused by rows.
  config.distributed.gradient_sync = GradientSyncMode::kPs;
  config.ps.shards = 4;
  EXPECT_FALSE(RunSpec::Resolve(config).ok());
  config.distributed.model_parallel = true;
  config.distributed.mp_dim = ModelParallelDim::kColumn;
  EXPECT_TRUE(RunSpec::Resolve(config).ok());
}

}  // namespace
}  // namespace gridsync
