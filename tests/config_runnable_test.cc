// Tests for common/config, continued: what a config can run
// (CheckRunnable) in every sync mode and feature, checkpoints included, and
// the enums' names. Part of config_keys_test's binary.
#include "tests/config_test_util.h"

namespace gridsync {
namespace {

TEST(ConfigCheckRunnableTest, DefaultConfigRuns) {
  EXPECT_TRUE(Config{}.CheckRunnable(false).ok());
  EXPECT_TRUE(Config{}.CheckRunnable(true).ok());
}

TEST(ConfigCheckRunnableTest, EverySyncModeRuns) {
  for (const char* sync : {"nccl", "ps", "hybrid"}) {
    const Config c = ParseOk(
        std::string(R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": ")") +
        sync + "\"}}");
    EXPECT_TRUE(c.CheckRunnable(/*standalone=*/false).ok()) << sync;
    EXPECT_TRUE(c.CheckRunnable(/*standalone=*/true).ok()) << sync;
  }
}

TEST(ConfigCheckRunnableTest, EveryModeRunsEveryFeature) {
  for (const char* sync : {"nccl", "ps", "hybrid"}) {
    for (const char* split : {"even", "weighted", "adaptive"}) {
      const Config c = ParseOk(std::string(R"({"distributed": {"enable": true, "world_size": 2,
                                   "gradient_sync": ")") +
                               sync + R"(", "batch_splitting": ")" + split +
                               R"("}, "training": {"mixed_precision": true,
                                   "gradient_accumulation": 2}})");
      EXPECT_TRUE(c.CheckRunnable(false).ok())
          << sync << " " << split << ": " << c.CheckRunnable(false).ToString();
    }
  }
  // A codec has nothing to compress in nccl's fp32 all-reduce: refused, not ignored.
  const Status codec = ParseOk(R"({"distributed": {"enable": true, "gradient_sync": "nccl"},
                                   "compression": {"codec": "onebit"}})")
                           .CheckRunnable(false);
  EXPECT_EQ(codec.code(), StatusCode::kUnsupported);
  EXPECT_TRUE(Contains(codec.message(), "compression.codec=onebit")) << codec.message();
  EXPECT_TRUE(Contains(codec.message(), "allowed: none, fp16, bf16")) << codec.message();
}

TEST(ConfigCheckRunnableTest, KeysThatDoNothingOnOneProcessOrWithoutCurveAreRefused) {
  // One process (distributed.enable false) sends and pulls nothing.
  const Status codec = ParseOk(R"({"compression": {"codec": "topk"}})").CheckRunnable(false);
  EXPECT_EQ(codec.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(codec.message(),
                       "compression.codec: \"topk\" has no effect with "
                       "distributed.enable false"))
      << codec.message();
  const Status pull =
      ParseOk(R"({"compression": {"codec": "fp16", "pull": true}})").CheckRunnable(false);
  EXPECT_TRUE(Contains(pull.message(), "compression.pull: true has no effect")) << pull.message();
  // The same section serves a cluster, and a distributed config run alone.
  const Config cluster = ParseOk(R"({"distributed": {"enable": true, "gradient_sync": "ps"},
                                     "compression": {"codec": "topk", "pull": true}})");
  EXPECT_TRUE(cluster.CheckRunnable(false).ok()) << cluster.CheckRunnable(false).ToString();
  EXPECT_TRUE(cluster.CheckRunnable(true).ok()) << cluster.CheckRunnable(true).ToString();
  // Under security.mode "off" no key is loaded.
  const std::string keys = ErrorOf(R"({"security": {"mode": "off", "keys_dir": "/etc/k"}})");
  EXPECT_TRUE(Contains(keys,
                       "security.keys_dir: \"/etc/k\" has no effect with security.mode "
                       "\"off\""))
      << keys;
  ParseOk(R"({"security": {"mode": "curve", "keys_dir": "/etc/k"}})");
  ParseOk(R"({"security": {"mode": "auto", "keys_dir": "/etc/k"}})");
}

TEST(ConfigCheckRunnableTest, NcclAllReducesInSixteenBitsOnlyWhereItCan) {
  for (const char* codec : {"fp16", "bf16"}) {
    const std::string base = std::string(R"({"distributed": {"enable": true, "world_size": 2,
        "gradient_sync": "nccl")");
    const std::string tail = std::string(R"(}, "compression": {"codec": ")") + codec + R"("}})";
    EXPECT_TRUE(ParseOk(base + tail).CheckRunnable(false).ok()) << codec;
    // Reduce-scatter and all-gather still sum fp32: refused, not ignored.
    for (const char* key : {"hierarchical", "model_parallel"}) {
      const Status s = ParseOk(base + ", \"" + key + "\": true" + tail).CheckRunnable(false);
      EXPECT_EQ(s.code(), StatusCode::kUnsupported) << codec << " " << key;
      EXPECT_TRUE(Contains(s.message(), std::string("distributed.") + key)) << s.message();
    }
    const Status pull = ParseOk(base + std::string(R"(}, "compression": {"codec": ")") + codec +
                                R"(", "pull": true}})")
                            .CheckRunnable(false);
    EXPECT_EQ(pull.code(), StatusCode::kUnsupported) << codec;
    EXPECT_TRUE(Contains(pull.message(), "compression.pull=true")) << pull.message();
  }
  // fp16's block sizes the scales of pushes; the all-reduce scales each
  // bucket by one power of two, so there the key would do nothing.
  const std::string fp16_block = R"(, "compression": {"codec": "fp16", "block": 64}})";
  const Status nccl_block = ParseOk(R"({"distributed": {"enable": true, "world_size": 2,
      "gradient_sync": "nccl"})" + fp16_block)
                                .CheckRunnable(false);
  EXPECT_EQ(nccl_block.code(), StatusCode::kUnsupported);
  EXPECT_TRUE(Contains(nccl_block.message(),
                       "compression.block=64: has no effect with "
                       "compression.codec=fp16 under "
                       "distributed.gradient_sync=nccl"))
      << nccl_block.message();
  for (const char* sync : {"ps", "hybrid"}) {
    const Config c = ParseOk(R"({"distributed": {"enable": true, "world_size": 2,
        "gradient_sync": ")" +
                             std::string(sync) + "\"}" + fp16_block);
    EXPECT_TRUE(c.CheckRunnable(false).ok()) << sync << ": " << c.CheckRunnable(false).ToString();
    EXPECT_EQ(c.compression.block, 64) << sync;
    EXPECT_EQ(c.ToJson()["compression"]["block"], 64) << sync;
  }
  // Unset under nccl, it is not written either (a resolved config loads).
  const Config nccl_fp16 = ParseOk(R"({"distributed": {"enable": true, "world_size": 2,
      "gradient_sync": "nccl"}, "compression": {"codec": "fp16"}})");
  EXPECT_FALSE(nccl_fp16.ToJson()["compression"].contains("block"));
}

TEST(ConfigCheckRunnableTest, PsRunsWithEvenSplitsOnly) {
  EXPECT_TRUE(
      ParseOk(R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": "ps"}})")
          .CheckRunnable(false)
          .ok());
  const Status uneven =
      ParseOk(R"({"distributed": {"enable": true, "world_size": 3, "gradient_sync": "ps"},
                                    "training": {"batch_size": 1000}})")
          .CheckRunnable(false);
  EXPECT_EQ(uneven.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(uneven.message(), "training.batch_size: 1000")) << uneven.message();
  EXPECT_TRUE(Contains(uneven.message(), "a multiple of 3")) << uneven.message();
}

TEST(ConfigCheckRunnableTest, OnlyImageTaskRuns) {
  const Config c = ParseOk(R"({"task": {"type": "sdf"}})");
  for (bool standalone : {false, true}) {
    const Status status = c.CheckRunnable(standalone);
    EXPECT_EQ(status.code(), StatusCode::kUnsupported);
    EXPECT_EQ(status.message(), "task.type=sdf: not supported yet; allowed now: image");
  }
}

TEST(ConfigCheckRunnableTest, BothProblemsReported) {
  const Config c = ParseOk(R"({"distributed": {"enable": true, "gradient_sync": "nccl"},
                               "compression": {"codec": "topk"}, "task": {"type": "nerf"}})");
  const Status status = c.CheckRunnable(/*standalone=*/false);
  EXPECT_EQ(status.code(), StatusCode::kUnsupported);
  EXPECT_EQ(CountLines(status.message()), 2u);
  EXPECT_TRUE(Contains(status.message(), "compression.codec=topk: not supported with"));
  EXPECT_TRUE(Contains(status.message(), "task.type=nerf: not supported yet"));
}

TEST(ConfigEnumTest, ToStringNames) {
  EXPECT_EQ(ToString(GradientSyncMode::kNccl), "nccl");
  EXPECT_EQ(ToString(GradientSyncMode::kPs), "ps");
  EXPECT_EQ(ToString(GradientSyncMode::kHybrid), "hybrid");
  EXPECT_EQ(ToString(BatchSplitting::kEven), "even");
  EXPECT_EQ(ToString(BatchSplitting::kWeighted), "weighted");
  EXPECT_EQ(ToString(BatchSplitting::kAdaptive), "adaptive");
  EXPECT_EQ(ToString(ModelParallelDim::kRow), "row");
  EXPECT_EQ(ToString(ModelParallelDim::kColumn), "column");
  EXPECT_EQ(ToString(ModelParallelDim::kBoth), "both");
  EXPECT_EQ(ToString(TaskType::kImage), "image");
  EXPECT_EQ(ToString(TaskType::kSdf), "sdf");
  EXPECT_EQ(ToString(TaskType::kNerf), "nerf");
}

// Checkpoints: ps and hybrid with bsp, where every shard's version is one
// state; refused elsewhere, naming what is allowed.
TEST(ConfigCheckRunnableTest, CheckpointsRunWithPsAndHybridUnderBsp) {
  for (const char* sync : {"ps", "hybrid"}) {
    const Config c = ParseOk(std::string(R"({"distributed": {"enable": true, "world_size": 2,
                                 "gradient_sync": ")") +
                             sync + R"("}, "checkpoint": {"every_steps": 10}})");
    EXPECT_TRUE(c.CheckRunnable(false).ok()) << sync << ": " << c.CheckRunnable(false).ToString();
    const Config ssp = ParseOk(std::string(R"({"distributed": {"enable": true, "world_size": 2,
                                   "gradient_sync": ")") +
                               sync + R"("}, "ps": {"consistency": "ssp"},
                                   "checkpoint": {"every_steps": 10}})");
    const Status refused = ssp.CheckRunnable(false);
    EXPECT_EQ(refused.code(), StatusCode::kUnsupported) << sync;
    EXPECT_TRUE(Contains(refused.message(), "allowed now: gradient_sync ps or hybrid"))
        << refused.message();
  }
  const Status nccl = ParseOk(R"({"distributed": {"enable": true, "gradient_sync": "nccl"},
                                  "checkpoint": {"every_steps": 10}})")
                          .CheckRunnable(false);
  EXPECT_EQ(nccl.code(), StatusCode::kUnsupported) << nccl.ToString();
}

}  // namespace
}  // namespace gridsync
