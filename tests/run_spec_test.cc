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

}  // namespace
}  // namespace gridsync
