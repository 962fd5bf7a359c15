// Tests for common/config: the seed configs, defaults, every kind of validation problem, overrides,
// the ToJson round trip and CheckRunnable. Runs with the repository root as working directory.

#include "common/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace gridsync {
namespace {

constexpr const char* kSource = "test.json";

::testing::AssertionResult Contains(const std::string& haystack, std::string_view needle) {
  if (haystack.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected to find [" << needle << "] in:\n" << haystack;
}

size_t CountLines(const std::string& text) {
  size_t lines = text.empty() ? 0 : 1;
  for (char c : text) lines += c == '\n' ? 1 : 0;
  return lines;
}

// Parses text that must fail validation and returns the message.
std::string ErrorOf(std::string_view text, const std::vector<std::string>& overrides = {}) {
  Result<Config> result = Config::Parse(text, kSource, overrides);
  EXPECT_FALSE(result.ok()) << "expected a validation error for: " << text;
  if (result.ok()) return "";
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  return result.status().message();
}

Config ParseOk(std::string_view text, const std::vector<std::string>& overrides = {}) {
  Result<Config> result = Config::Parse(text, kSource, overrides);
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  return result.ok() ? std::move(result).value() : Config{};
}

// --- Seed configs ---------------------------------------------------------------------------

TEST(ConfigSeedTest, SmallLoadsWithItsValues) {
  Result<Config> c = Config::LoadFile("configs/distributed_small.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->source, "configs/distributed_small.json");
  EXPECT_EQ(c->encoding.otype, "HashGrid");
  EXPECT_EQ(c->encoding.n_levels, 16);
  EXPECT_EQ(c->encoding.log2_hashmap_size, 19);
  EXPECT_DOUBLE_EQ(c->encoding.per_level_scale, 1.5);
  EXPECT_TRUE(c->distributed.enable);
  EXPECT_EQ(c->distributed.world_size, 4);
  EXPECT_EQ(c->distributed.master_addr, "192.168.1.100");
  EXPECT_EQ(c->distributed.master_port, 29500);
  EXPECT_EQ(c->distributed.gradient_sync, GradientSyncMode::kNccl);
  EXPECT_EQ(c->distributed.batch_splitting, BatchSplitting::kEven);
  EXPECT_FALSE(c->distributed.model_parallel);
  EXPECT_FALSE(c->distributed.hierarchical);
  EXPECT_EQ(c->training.batch_size, 4096);
  EXPECT_DOUBLE_EQ(c->training.learning_rate, 0.001);
  EXPECT_TRUE(c->training.mixed_precision);
  EXPECT_EQ(c->training.gradient_accumulation, 1);
  EXPECT_FALSE(c->training.dynamic_resolution);
}

TEST(ConfigSeedTest, MediumLoadsWithItsValues) {
  Result<Config> c = Config::LoadFile("configs/distributed_medium.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->encoding.log2_hashmap_size, 21);
  EXPECT_EQ(c->distributed.world_size, 16);
  EXPECT_EQ(c->distributed.batch_splitting, BatchSplitting::kWeighted);
  EXPECT_TRUE(c->distributed.model_parallel);
  EXPECT_EQ(c->distributed.mp_dim, ModelParallelDim::kColumn);
  EXPECT_FALSE(c->distributed.hierarchical);
  EXPECT_EQ(c->training.batch_size, 8192);
  EXPECT_DOUBLE_EQ(c->training.learning_rate, 0.0005);
  EXPECT_EQ(c->training.gradient_accumulation, 2);
}

TEST(ConfigSeedTest, LargeLoadsWithItsValues) {
  Result<Config> c = Config::LoadFile("configs/distributed_large.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->encoding.log2_hashmap_size, 22);
  EXPECT_EQ(c->distributed.world_size, 32);
  EXPECT_EQ(c->distributed.gradient_sync, GradientSyncMode::kNccl);
  EXPECT_EQ(c->distributed.batch_splitting, BatchSplitting::kAdaptive);
  EXPECT_TRUE(c->distributed.model_parallel);
  EXPECT_EQ(c->distributed.mp_dim, ModelParallelDim::kBoth);
  EXPECT_TRUE(c->distributed.hierarchical);
  EXPECT_EQ(c->training.batch_size, 16384);
  EXPECT_DOUBLE_EQ(c->training.learning_rate, 0.00025);
  EXPECT_TRUE(c->training.mixed_precision);
  EXPECT_EQ(c->training.gradient_accumulation, 4);
  EXPECT_TRUE(c->training.dynamic_resolution);
  EXPECT_EQ(c->training.dynamic_resolution_steps, 0);
}

TEST(ConfigSeedTest, SeedsRunLocallyWithOverriddenAddress) {
  for (const char* path : {"configs/distributed_small.json", "configs/distributed_medium.json",
                           "configs/distributed_large.json"}) {
    Result<Config> c = Config::LoadFile(path, {"distributed.master_addr=127.0.0.1"});
    ASSERT_TRUE(c.ok()) << path << ": " << c.status().ToString();
    EXPECT_EQ(c->distributed.master_addr, "127.0.0.1") << path;
    // Every seed runs as shipped, in every gradient_sync mode (mixed
    // precision, adaptive and weighted splitting, model parallelism).
    for (const char* sync : {"nccl", "ps", "hybrid"}) {
      std::vector<std::string> overrides = {"distributed.master_addr=127.0.0.1",
                                            std::string("distributed.gradient_sync=") + sync};
      // The large seed's hierarchical all-reduce has no counterpart in plain
      // ps (refused there, pointing at hybrid).
      if (std::string(path).find("large") != std::string::npos && std::string(sync) == "ps")
        overrides.push_back("distributed.hierarchical=false");
      Result<Config> mode = Config::LoadFile(path, overrides);
      ASSERT_TRUE(mode.ok()) << path << " " << sync << ": " << mode.status().ToString();
      const Status runnable = mode->CheckRunnable(/*standalone=*/false);
      EXPECT_TRUE(runnable.ok()) << path << " " << sync << ": " << runnable.ToString();
    }
    EXPECT_TRUE(c->CheckRunnable(/*standalone=*/true).ok()) << path;
  }
}

TEST(ConfigLoadFileTest, MissingFileIsIOErrorNamingThePath) {
  Result<Config> c = Config::LoadFile("configs/no_such_config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kIOError);
  EXPECT_TRUE(Contains(c.status().message(), "configs/no_such_config.json"));
}

TEST(ConfigLoadFileTest, DirectoryIsIOError) {
  Result<Config> c = Config::LoadFile("configs");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kIOError);
  EXPECT_TRUE(Contains(c.status().message(), "configs"));
}

TEST(ConfigLoadFileTest, ValidationErrorsNameTheFile) {
  Result<Config> c = Config::LoadFile("configs/distributed_small.json", {"training.steps=0"});
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Contains(c.status().message(), "configs/distributed_small.json: training.steps: "));
}

// --- Defaults and syntax ----------------------------------------------------------------------

TEST(ConfigDefaultsTest, EmptyObjectGivesHeaderDefaults) {
  const Config c = ParseOk("{}");
  const Config d;
  EXPECT_EQ(c.source, kSource);
  EXPECT_EQ(c.encoding.otype, "HashGrid");
  EXPECT_EQ(c.encoding.n_levels, 16);
  EXPECT_EQ(c.encoding.n_features_per_level, 2);
  EXPECT_EQ(c.encoding.log2_hashmap_size, 19);
  EXPECT_EQ(c.encoding.base_resolution, 16);
  EXPECT_DOUBLE_EQ(c.encoding.per_level_scale, 1.5);
  EXPECT_EQ(c.network.n_neurons, 64);
  EXPECT_EQ(c.network.n_hidden_layers, 2);
  EXPECT_FALSE(c.distributed.enable);
  EXPECT_EQ(c.distributed.world_size, 1);
  EXPECT_EQ(c.distributed.master_addr, "127.0.0.1");
  EXPECT_EQ(c.distributed.master_port, 29500);
  EXPECT_EQ(c.distributed.gradient_sync, GradientSyncMode::kNccl);
  EXPECT_EQ(c.distributed.batch_splitting, BatchSplitting::kEven);
  EXPECT_FALSE(c.distributed.model_parallel);
  EXPECT_EQ(c.distributed.mp_dim, ModelParallelDim::kRow);
  EXPECT_FALSE(c.distributed.hierarchical);
  EXPECT_EQ(c.training.batch_size, 16384);
  EXPECT_DOUBLE_EQ(c.training.learning_rate, 1e-2);
  EXPECT_FALSE(c.training.mixed_precision);
  EXPECT_EQ(c.training.gradient_accumulation, 1);
  EXPECT_FALSE(c.training.dynamic_resolution);
  EXPECT_EQ(c.training.dynamic_resolution_steps, 0);
  EXPECT_EQ(c.training.steps, 1000);
  EXPECT_EQ(c.training.seed, 1337u);
  EXPECT_EQ(c.training.threads, 1);
  EXPECT_EQ(c.training.log_every, 100);
  EXPECT_EQ(c.task.type, TaskType::kImage);
  EXPECT_EQ(c.task.image, kDefaultImagePath);
  EXPECT_EQ(c.task.output, "out");
  EXPECT_EQ(c.ToJson(), d.ToJson());
}

TEST(ConfigDefaultsTest, EmptySectionsGiveDefaults) {
  const Config c =
      ParseOk(R"({"encoding": {}, "network": {}, "distributed": {}, "training": {}, "task": {}})");
  EXPECT_EQ(c.ToJson(), Config{}.ToJson());
}

TEST(ConfigDefaultsTest, PartialSectionKeepsOtherDefaults) {
  const Config c = ParseOk(R"({"training": {"steps": 7}})");
  EXPECT_EQ(c.training.steps, 7);
  EXPECT_EQ(c.training.batch_size, 16384);
  EXPECT_EQ(c.encoding.n_levels, 16);
}

TEST(ConfigSyntaxTest, CommentsAndUtf8Accepted) {
  const Config c = ParseOk(
      "// 顶层注释\n"
      "{\n"
      "  /* 块注释 spanning\n lines */\n"
      "  \"network\": {\"n_neurons\": 32},  // 神经元数量\n"
      "  \"task\": {\"output\": \"输出/目录\"}\n"
      "}\n");
  EXPECT_EQ(c.network.n_neurons, 32);
  EXPECT_EQ(c.task.output, "输出/目录");
}

TEST(ConfigSyntaxTest, InvalidJsonReportsLineAndColumn) {
  const std::string msg = ErrorOf("{\n  \"training\": {\"steps\": 5\n  \"seed\": 1}\n}");
  EXPECT_TRUE(Contains(msg, "test.json:3:"));
  EXPECT_TRUE(Contains(msg, "invalid JSON"));
  EXPECT_TRUE(Contains(msg, "allowed: JSON text"));
}

TEST(ConfigSyntaxTest, TrailingGarbageAndEmptyInputAreInvalid) {
  EXPECT_TRUE(Contains(ErrorOf("{} x"), "test.json:1:4: invalid JSON"));
  EXPECT_TRUE(Contains(ErrorOf(""), "invalid JSON"));
}

TEST(ConfigSyntaxTest, NumberOverflowIsInvalidJson) {
  EXPECT_TRUE(Contains(ErrorOf(R"({"training": {"learning_rate": 1e400}})"), "1e400"));
}

TEST(ConfigSyntaxTest, InvalidUtf8ReportedEvenInComments) {
  const std::string msg = ErrorOf("{\n  // bad \xff byte\n}");
  EXPECT_TRUE(Contains(msg, "test.json:2:10: invalid UTF-8 (byte 0xFF)"));
  EXPECT_TRUE(Contains(msg, "allowed: JSON text (UTF-8"));
  // Overlong encoding of '/' and a lone surrogate are rejected too.
  EXPECT_TRUE(Contains(ErrorOf("{\"task\": {\"output\": \"\xC0\xAF\"}}"), "invalid UTF-8"));
  EXPECT_TRUE(Contains(ErrorOf("{\"task\": {\"output\": \"\xED\xA0\x80\"}}"), "invalid UTF-8"));
}

TEST(ConfigSyntaxTest, DuplicateKeysReportedWithPath) {
  const std::string msg = ErrorOf(R"({"training": {"steps": 1, "seed": 2, "steps": 3}})");
  EXPECT_TRUE(Contains(msg, "test.json: training.steps: duplicate key"));
  EXPECT_TRUE(Contains(msg, "allowed: each key at most once per object"));

  const std::string top = ErrorOf(R"({"network": {}, "training": {}, "network": {}})");
  EXPECT_TRUE(Contains(top, "test.json: network: duplicate key"));

  // The same key in different objects is fine.
  ParseOk(R"({"encoding": {"n_levels": 8}, "network": {"n_neurons": 8}})");
}

TEST(ConfigSyntaxTest, TopLevelAndSectionsMustBeObjects) {
  const std::string root = ErrorOf("[1, 2]");
  EXPECT_TRUE(Contains(root, "(top level): wrong type: expected an object, got [1, 2] (array)"));
  const std::string section = ErrorOf(R"({"training": 5})");
  EXPECT_TRUE(Contains(section, "test.json: training: wrong type: expected an object, got 5"));
  EXPECT_TRUE(Contains(section, "allowed: an object"));
}

// --- Validation problems ----------------------------------------------------------------------

TEST(ConfigValidationTest, UnknownTopLevelKey) {
  const std::string msg = ErrorOf(R"({"compresion": {"codec": "fp16"}})");
  EXPECT_TRUE(Contains(msg, "test.json: compresion: unknown key (did you mean \"compression\"?)")) << msg;
  EXPECT_TRUE(Contains(msg, "allowed: sections encoding, network, distributed, training, task, ps, compression")) << msg;
}

TEST(ConfigValidationTest, UnknownNestedKeyListsSectionKeysAndSuggests) {
  const std::string msg = ErrorOf(R"({"encoding": {"n_level": 8}})");
  EXPECT_TRUE(
      Contains(msg, "test.json: encoding.n_level: unknown key (did you mean \"n_levels\"?)"));
  EXPECT_TRUE(Contains(msg,
                       "allowed: keys of encoding: otype, n_levels, n_features_per_level, "
                       "log2_hashmap_size, base_resolution, per_level_scale"));
}

TEST(ConfigValidationTest, WrongTypeBoolean) {
  const std::string msg = ErrorOf(R"({"training": {"mixed_precision": "yes"}})");
  EXPECT_TRUE(Contains(msg,
                       "test.json: training.mixed_precision: wrong type: expected a boolean, "
                       "got \"yes\" (string); allowed: true, false"));
  EXPECT_TRUE(Contains(ErrorOf(R"({"distributed": {"enable": 1}})"), "got 1 (integer)"));
}

TEST(ConfigValidationTest, FloatForIntegerRejected) {
  const std::string msg = ErrorOf(R"({"training": {"steps": 3.5}})");
  EXPECT_TRUE(Contains(msg,
                       "training.steps: wrong type: expected an integer, got 3.5 "
                       "(floating-point number); allowed: integers 1..10000000"));
  // 3.0 is written as a float, so it is not an integer either.
  EXPECT_TRUE(
      Contains(ErrorOf(R"({"network": {"n_neurons": 3.0}})"), "network.n_neurons: wrong type"));
}

TEST(ConfigValidationTest, StringForNumberRejected) {
  const std::string msg = ErrorOf(R"({"training": {"steps": "3"}})");
  EXPECT_TRUE(Contains(msg,
                       "training.steps: wrong type: expected an integer, got \"3\" (string); "
                       "allowed: integers 1..10000000"));
  const std::string lr = ErrorOf(R"({"training": {"learning_rate": "0.1"}})");
  EXPECT_TRUE(Contains(lr,
                       "training.learning_rate: wrong type: expected a number, got \"0.1\" "
                       "(string); allowed: finite numbers in (0, 10]"));
}

TEST(ConfigValidationTest, FloatKeysAcceptIntegers) {
  const Config c =
      ParseOk(R"({"encoding": {"per_level_scale": 2}, "training": {"learning_rate": 1}})");
  EXPECT_DOUBLE_EQ(c.encoding.per_level_scale, 2.0);
  EXPECT_DOUBLE_EQ(c.training.learning_rate, 1.0);
}

TEST(ConfigValidationTest, OutOfRangeLowAndHigh) {
  EXPECT_TRUE(Contains(ErrorOf(R"({"encoding": {"n_levels": 0}})"),
                       "test.json: encoding.n_levels: out of range: 0; allowed: integers 1..32"));
  EXPECT_TRUE(Contains(ErrorOf(R"({"encoding": {"n_levels": 33}})"),
                       "encoding.n_levels: out of range: 33; allowed: integers 1..32"));
  EXPECT_TRUE(Contains(ErrorOf(R"({"distributed": {"master_port": 70000}})"),
                       "distributed.master_port: out of range: 70000; allowed: integers 1..65535"));
  EXPECT_TRUE(Contains(ErrorOf(R"({"network": {"n_hidden_layers": -1}})"),
                       "network.n_hidden_layers: out of range: -1; allowed: integers 0..16"));
  EXPECT_TRUE(Contains(ErrorOf(R"({"training": {"steps": 18446744073709551615}})"),
                       "training.steps: out of range: 18446744073709551615"));
}

TEST(ConfigValidationTest, FloatRangesIncludingOpenBound) {
  EXPECT_TRUE(
      Contains(ErrorOf(R"({"training": {"learning_rate": 0}})"),
               "training.learning_rate: out of range: 0; allowed: finite numbers in (0, 10]"));
  EXPECT_TRUE(Contains(ErrorOf(R"({"training": {"learning_rate": 10.5}})"),
                       "training.learning_rate: out of range: 10.5"));
  EXPECT_TRUE(
      Contains(ErrorOf(R"({"encoding": {"per_level_scale": 0.5}})"),
               "encoding.per_level_scale: out of range: 0.5; allowed: finite numbers in [1, 16]"));
  const Config c =
      ParseOk(R"({"training": {"learning_rate": 10}, "encoding": {"per_level_scale": 1}})");
  EXPECT_DOUBLE_EQ(c.training.learning_rate, 10.0);
}

TEST(ConfigValidationTest, FeaturesPerLevelMustBeAPowerOfTwoUpToEight) {
  EXPECT_TRUE(
      Contains(ErrorOf(R"({"encoding": {"n_features_per_level": 3}})"),
               "encoding.n_features_per_level: not an allowed value: 3; allowed: 1, 2, 4, 8"));
  EXPECT_EQ(ParseOk(R"({"encoding": {"n_features_per_level": 8}})").encoding.n_features_per_level,
            8);
}

TEST(ConfigValidationTest, SeedIsANonNegativeUint64) {
  EXPECT_EQ(ParseOk(R"({"training": {"seed": 18446744073709551615}})").training.seed, UINT64_MAX);
  EXPECT_TRUE(
      Contains(ErrorOf(R"({"training": {"seed": -1}})"),
               "training.seed: out of range: -1; allowed: integers 0..18446744073709551615"));
  EXPECT_TRUE(Contains(ErrorOf(R"({"training": {"seed": 1.5}})"),
                       "training.seed: wrong type: expected an integer, got 1.5"));
}

TEST(ConfigValidationTest, BadEnumStrings) {
  EXPECT_TRUE(Contains(ErrorOf(R"({"distributed": {"gradient_sync": "mpi"}})"),
                       "distributed.gradient_sync: unknown value \"mpi\"; "
                       "allowed: \"nccl\", \"ps\", \"hybrid\""));
  EXPECT_TRUE(Contains(ErrorOf(R"({"distributed": {"batch_splitting": "random"}})"),
                       "distributed.batch_splitting: unknown value \"random\"; "
                       "allowed: \"even\", \"weighted\", \"adaptive\""));
  EXPECT_TRUE(Contains(
      ErrorOf(R"({"distributed": {"model_parallel": true, "mp_dim": "diagonal"}})"),
      "distributed.mp_dim: unknown value \"diagonal\"; allowed: \"row\", \"column\", \"both\""));
  EXPECT_TRUE(
      Contains(ErrorOf(R"({"task": {"type": "video"}})"),
               "task.type: unknown value \"video\"; allowed: \"image\", \"sdf\", \"nerf\""));
  EXPECT_TRUE(Contains(ErrorOf(R"({"encoding": {"otype": "Frequency"}})"),
                       "encoding.otype: unknown value \"Frequency\"; allowed: \"HashGrid\""));
  EXPECT_TRUE(Contains(ErrorOf(R"({"distributed": {"gradient_sync": "NCCL"}})"),
                       "unknown value \"NCCL\" (values are case-sensitive)"));
  EXPECT_TRUE(Contains(ErrorOf(R"({"distributed": {"gradient_sync": 1}})"),
                       "distributed.gradient_sync: wrong type: expected a string, got 1 (integer); "
                       "allowed: \"nccl\", \"ps\", \"hybrid\""));
}

TEST(ConfigValidationTest, MasterAddrRules) {
  EXPECT_TRUE(
      Contains(ErrorOf(R"({"distributed": {"master_addr": ""}})"),
               "distributed.master_addr: empty string; allowed: a host name or IP address"));
  EXPECT_TRUE(Contains(ErrorOf(R"({"distributed": {"master_addr": "10.0.0.1 "}})"),
                       "distributed.master_addr: contains a space or control character: "
                       "\"10.0.0.1 \""));
  const std::string long_name(254, 'a');
  EXPECT_TRUE(Contains(ErrorOf(R"({"distributed": {"master_addr": ")" + long_name + "\"}}"),
                       "distributed.master_addr: too long (254 characters)"));
  EXPECT_EQ(ParseOk(R"({"distributed": {"master_addr": ")" + std::string(253, 'a') + "\"}}")
                .distributed.master_addr.size(),
            253u);
}

TEST(ConfigValidationTest, TaskPathsMustBeNonEmptyStrings) {
  EXPECT_TRUE(Contains(ErrorOf(R"({"task": {"image": ""}})"),
                       "task.image: empty string; allowed: a non-empty path"));
  EXPECT_TRUE(Contains(ErrorOf(R"({"task": {"output": 5}})"),
                       "task.output: wrong type: expected a string, got 5 (integer); "
                       "allowed: a non-empty folder path"));
  EXPECT_TRUE(Contains(ErrorOf(R"({"task": {"output": "a\u0000b"}})"),
                       "task.output: contains a NUL character"));
}

TEST(ConfigValidationTest, LongValuesAreShortenedInMessages) {
  const std::string msg = ErrorOf(R"({"training": {"steps": ")" + std::string(500, 'x') + "\"}}");
  EXPECT_TRUE(Contains(msg, "training.steps: wrong type"));
  EXPECT_LT(msg.size(), 250u) << msg;
}

// --- Unsupported combinations -----------------------------------------------------------------

TEST(ConfigCombinationTest, GradientAccumulationMustDivideBatchSize) {
  const std::string msg =
      ErrorOf(R"({"training": {"batch_size": 4096, "gradient_accumulation": 3}})");
  EXPECT_TRUE(Contains(msg,
                       "test.json: training.gradient_accumulation: 3 does not divide "
                       "training.batch_size 4096"));
  EXPECT_TRUE(
      Contains(msg, "allowed: a divisor of training.batch_size in 1..1024, nearest: 2 or 4"));
}

TEST(ConfigCombinationTest, MicroBatchMustHoldAtLeastOneSample) {
  const std::string msg = ErrorOf(R"({"training": {"batch_size": 2, "gradient_accumulation": 4}})");
  EXPECT_TRUE(
      Contains(msg, "training.gradient_accumulation: 4 does not divide training.batch_size 2"));
  EXPECT_TRUE(Contains(msg, "nearest: 2"));
}

TEST(ConfigCombinationTest, MpDimWithoutModelParallel) {
  const std::string msg = ErrorOf(R"({"distributed": {"mp_dim": "column"}})");
  EXPECT_TRUE(Contains(msg,
                       "test.json: distributed.mp_dim: \"column\" has no effect unless "
                       "distributed.model_parallel is true; allowed: distributed.mp_dim only with "
                       "distributed.model_parallel: true"));
  EXPECT_TRUE(Contains(ErrorOf(R"({"distributed": {"model_parallel": false, "mp_dim": "row"}})"),
                       "distributed.mp_dim: \"row\" has no effect"));
}

TEST(ConfigCombinationTest, HierarchicalNeedsANodeLevelStage) {
  const std::string msg =
      ErrorOf(R"({"distributed": {"hierarchical": true, "gradient_sync": "ps"}})");
  EXPECT_TRUE(Contains(msg,
                       "test.json: distributed.hierarchical: true needs a node-level stage, which "
                       "gradient_sync \"ps\" does not have; allowed: distributed.hierarchical: "
                       "true with gradient_sync \"nccl\""))
      << msg;
  EXPECT_TRUE(ParseOk(R"({"distributed": {"hierarchical": true, "gradient_sync": "hybrid"}})")
                  .distributed.hierarchical);
  EXPECT_TRUE(ParseOk(R"({"distributed": {"hierarchical": true}})").distributed.hierarchical);
}

TEST(ConfigCombinationTest, DynamicResolutionStepsNeedDynamicResolution) {
  const std::string msg = ErrorOf(R"({"training": {"dynamic_resolution_steps": 500}})");
  EXPECT_TRUE(Contains(msg,
                       "test.json: training.dynamic_resolution_steps: 500 has no effect unless "
                       "training.dynamic_resolution is true; allowed: 0 while "
                       "training.dynamic_resolution is false"));
  const Config c =
      ParseOk(R"({"training": {"dynamic_resolution": true, "dynamic_resolution_steps": 500}})");
  EXPECT_EQ(c.training.dynamic_resolution_steps, 500);
}

TEST(ConfigCombinationTest, WorldSizeNeedsEnable) {
  const std::string msg = ErrorOf(R"({"distributed": {"world_size": 4}})");
  EXPECT_TRUE(Contains(msg,
                       "test.json: distributed.world_size: 4 needs distributed.enable true; "
                       "allowed: 1 while distributed.enable is false"));
  EXPECT_EQ(ParseOk(R"({"distributed": {"enable": true, "world_size": 4}})").distributed.world_size,
            4);
}

TEST(ConfigCombinationTest, NoFollowUpErrorWhenAPartIsInvalid) {
  // batch_size is invalid on its own; the divisibility check must not pile on.
  const std::string msg =
      ErrorOf(R"({"training": {"batch_size": "4096", "gradient_accumulation": 3}})");
  EXPECT_EQ(CountLines(msg), 1u) << msg;
  EXPECT_TRUE(Contains(msg, "training.batch_size: wrong type"));
}

TEST(ConfigValidationTest, AllProblemsReportedTogether) {
  const std::string msg = ErrorOf(R"({
    "encoding": {"n_levels": 99, "colour": 1},
    "network": {"n_neurons": "64"},
    "distributed": {"gradient_sync": "mpi", "world_size": 4},
    "extra": true
  })");
  EXPECT_EQ(CountLines(msg), 6u) << msg;
  EXPECT_TRUE(Contains(msg, "test.json: encoding.n_levels: out of range: 99"));
  EXPECT_TRUE(Contains(msg, "test.json: encoding.colour: unknown key"));
  EXPECT_TRUE(Contains(msg, "test.json: network.n_neurons: wrong type"));
  EXPECT_TRUE(Contains(msg, "test.json: distributed.gradient_sync: unknown value \"mpi\""));
  EXPECT_TRUE(Contains(msg, "test.json: distributed.world_size: 4 needs distributed.enable true"));
  EXPECT_TRUE(Contains(msg, "test.json: extra: unknown key"));
}

// --- Overrides ----------------------------------------------------------------------------------

TEST(ConfigOverrideTest, ValuesParsedAsJsonOrTakenAsStrings) {
  const Config c = ParseOk(
      R"({"training": {"steps": 100}})",
      {"distributed.master_addr=127.0.0.1", "training.steps=5", "training.mixed_precision=true",
       "training.learning_rate=0.5", "task.output=\"123\"", "task.image=/tmp/a b.png"});
  EXPECT_EQ(c.distributed.master_addr, "127.0.0.1");
  EXPECT_EQ(c.training.steps, 5);
  EXPECT_TRUE(c.training.mixed_precision);
  EXPECT_DOUBLE_EQ(c.training.learning_rate, 0.5);
  EXPECT_EQ(c.task.output, "123");
  EXPECT_EQ(c.task.image, "/tmp/a b.png");
}

TEST(ConfigOverrideTest, LaterOverrideWinsAndMissingSectionIsCreated) {
  const Config c = ParseOk("{}", {"network.n_neurons=16", "network.n_neurons=32"});
  EXPECT_EQ(c.network.n_neurons, 32);
}

TEST(ConfigOverrideTest, OverrideCanFixAnInvalidFileValue) {
  const Config c = ParseOk(R"({"distributed": {"world_size": 4}})", {"distributed.enable=true"});
  EXPECT_TRUE(c.distributed.enable);
}

TEST(ConfigOverrideTest, MissingEqualsIsAnError) {
  const std::string msg = ErrorOf("{}", {"training.steps"});
  EXPECT_TRUE(Contains(msg,
                       "test.json: --set \"training.steps\": missing '='; allowed: "
                       "section.key=value"));
}

TEST(ConfigOverrideTest, EmptyKeySegmentIsAnError) {
  const std::string msg = ErrorOf("{}", {"training..steps=5"});
  EXPECT_TRUE(Contains(msg, "--set \"training..steps=5\": empty key in path \"training..steps\""));
  EXPECT_TRUE(Contains(ErrorOf("{}", {"=5"}), "--set \"=5\": empty key"));
}

TEST(ConfigOverrideTest, UnknownKeysCaughtByNormalCheck) {
  const std::string msg = ErrorOf("{}", {"training.stepz=5"});
  EXPECT_TRUE(Contains(msg, "test.json: training.stepz: unknown key (did you mean \"steps\"?)"));
  EXPECT_TRUE(Contains(ErrorOf("{}", {"trainig.steps=5"}), "test.json: trainig: unknown key"));
}

TEST(ConfigOverrideTest, OverrideValuesAreValidated) {
  const std::string msg = ErrorOf("{}", {"training.steps=abc"});
  EXPECT_TRUE(Contains(msg,
                       "training.steps: wrong type: expected an integer, got \"abc\" (string); "
                       "allowed: integers 1..10000000"));
}

TEST(ConfigOverrideTest, DescendingIntoAValueIsAnError) {
  const std::string msg = ErrorOf("{}", {"training.steps=5", "training.steps.x=1"});
  EXPECT_TRUE(Contains(msg,
                       "--set \"training.steps.x=1\": training.steps is 5 (integer), not a "
                       "section"));
}

TEST(ConfigOverrideTest, InvalidUtf8IsAnError) {
  EXPECT_TRUE(Contains(ErrorOf("{}", {"task.output=\xff"}), "not valid UTF-8"));
}

// --- ToJson ------------------------------------------------------------------------------------

// (Which keys it prints: PrintsExactlyTheKeysTheParserReads.)
TEST(ConfigToJsonTest, EnumsPrintAsStrings) {
  Result<Config> c = Config::LoadFile("configs/distributed_large.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const nlohmann::json j = c->ToJson();
  EXPECT_EQ(j["compression"]["codec"], "none");
  EXPECT_EQ(j["ps"]["consistency"], "bsp");
  EXPECT_EQ(j["ps"]["optimizer"], "auto");
  EXPECT_EQ(j["distributed"]["gradient_sync"], "nccl");
  EXPECT_EQ(j["distributed"]["batch_splitting"], "adaptive");
  EXPECT_EQ(j["distributed"]["mp_dim"], "both");
  EXPECT_EQ(j["task"]["type"], "image");
  EXPECT_EQ(j["encoding"]["log2_hashmap_size"], 22);
  EXPECT_EQ(j["training"]["seed"], 1337u);
}

// The keys ToJson prints are exactly the keys Parse reads, per section:
// both lists come from the code (the parser names what it reads in its
// unknown-key error), none is kept by hand.
TEST(ConfigToJsonTest, PrintsExactlyTheKeysTheParserReads) {
  auto allowed_keys = [](const std::string& section) {
    const std::string msg = ErrorOf("{\"" + section + "\": {\"zzz\": 1}}");
    const std::string marker = "allowed: keys of " + section + ": ";
    const size_t at = msg.find(marker);
    EXPECT_NE(at, std::string::npos) << msg;
    std::set<std::string> keys;
    std::string rest = at == std::string::npos ? "" : msg.substr(at + marker.size());
    rest = rest.substr(0, rest.find('\n'));
    size_t start = 0;
    while (start <= rest.size()) {
      const size_t comma = rest.find(", ", start);
      keys.insert(
          rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 2;
    }
    return keys;
  };
  // Every conditional key switched on: ssp staleness, a given ps.host,
  // mp_dim with model parallelism, nodes.
  const Config full = ParseOk(R"({
      "distributed": {"enable": true, "world_size": 2, "gradient_sync": "ps",
                      "model_parallel": true, "mp_dim": "column",
                      "nodes": [{"name": "a", "workers": 1}, {"name": "b", "workers": 1}]},
      "ps": {"consistency": "ssp", "staleness": 3, "host": "127.0.0.1", "base_port": 26000},
      "compression": {"codec": "topk"}, "security": {"keys_dir": "/etc/gridsync/keys"}})");
  const nlohmann::json j = full.ToJson();
  std::set<std::string> sections;
  for (const auto& [section, value] : j.items()) {
    sections.insert(section);
    std::set<std::string> printed;
    for (const auto& [key, v] : value.items()) printed.insert(key);
    EXPECT_EQ(printed, allowed_keys(section)) << section;
  }
  EXPECT_EQ(sections.size(), 10u);
}

TEST(ConfigMetricsTest, PortsMustFitAndStayClearOfTheClusters) {
  const Config ok =
      ParseOk(R"({"distributed": {"master_port": 29500}, "metrics": {"port": 9400}})");
  EXPECT_EQ(ok.metrics.port, 9400);
  for (const char* bad : {R"({"distributed": {"master_port": 29500}, "metrics": {"port": 29499}})",
                          R"({"metrics": {"port": 65535}})", R"({"metrics": {"port": -1}})",
                          R"({"metrics": {"prot": 9400}})"}) {
    auto parsed = Config::Parse(bad, "metrics.json");
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.status().message().find("metrics."), std::string::npos)
        << parsed.status().message();
  }
}

TEST(ConfigToJsonTest, MpDimOmittedWithoutModelParallel) {
  const nlohmann::json j = Config{}.ToJson();
  EXPECT_FALSE(j["distributed"].contains("mp_dim"));
  EXPECT_TRUE(j["distributed"].contains("model_parallel"));
}

TEST(ConfigNodesTest, NodesAssignRanksAndMustSumToWorldSize) {
  const Config c = ParseOk(R"({"distributed": {"enable": true, "world_size": 4, "nodes": [
      {"name": "a", "workers": 1, "weight": 2.0}, {"name": "b", "workers": 3}]}})");
  ASSERT_EQ(c.distributed.nodes.size(), 2u);
  EXPECT_EQ(c.distributed.NodeOf(0), 0);
  EXPECT_EQ(c.distributed.NodeOf(1), 1);
  EXPECT_EQ(c.distributed.NodeOf(3), 1);
  EXPECT_EQ(c.distributed.LocalRankOf(3), 2);
  EXPECT_EQ(c.distributed.nodes[0].weight, 2.0);
  EXPECT_EQ(c.distributed.nodes[1].weight, 1.0);
  EXPECT_EQ(Config::Parse(c.ToJson().dump(), "rt")->distributed.nodes.size(), 2u);
  const std::string sum = ErrorOf(R"({"distributed": {"enable": true, "world_size": 4,
      "nodes": [{"name": "a", "workers": 1}]}})");
  EXPECT_TRUE(Contains(sum, "distributed.nodes")) << sum;
  EXPECT_TRUE(Contains(sum, "add up to 1")) << sum;
  const std::string dup = ErrorOf(R"({"distributed": {"enable": true, "world_size": 2,
      "nodes": [{"name": "a"}, {"name": "a"}]}})");
  EXPECT_TRUE(Contains(dup, "duplicate node name")) << dup;
  const std::string type = ErrorOf(R"({"distributed": {"nodes": 3}})");
  EXPECT_TRUE(Contains(type, "expected an array")) << type;
  const std::string unknown = ErrorOf(R"({"distributed": {"enable": true, "world_size": 1,
      "nodes": [{"name": "a", "gpus": 1}]}})");
  EXPECT_TRUE(Contains(unknown, "distributed.nodes[0].gpus")) << unknown;
  const Config single = ParseOk(R"({"distributed": {"enable": true, "world_size": 3}})");
  EXPECT_EQ(single.distributed.ResolvedNodes().size(), 1u);
  EXPECT_EQ(single.distributed.LocalRankOf(2), 2);
}

TEST(ConfigPsTest, KeysValidateAndStalenessNeedsSsp) {
  const Config c = ParseOk(R"({"ps": {"shards": 4, "consistency": "ssp", "staleness": 3, "threads": 2,
                                      "host": "127.0.0.1", "base_port": 31000}})");
  EXPECT_EQ(c.ps.shards, 4);
  EXPECT_EQ(c.ps.consistency, Consistency::kSsp);
  EXPECT_EQ(c.ps.staleness, 3);
  EXPECT_EQ(c.ps.base_port, 31000);
  EXPECT_EQ(c.ToJson()["ps"]["staleness"], 3);
  const std::string staleness = ErrorOf(R"({"ps": {"consistency": "bsp", "staleness": 2}})");
  EXPECT_TRUE(Contains(staleness, "ps.staleness")) << staleness;
  EXPECT_TRUE(Contains(staleness, "ssp")) << staleness;
  const std::string shards = ErrorOf(R"({"ps": {"shards": 0}})");
  EXPECT_TRUE(Contains(shards, "ps.shards")) << shards;
  EXPECT_TRUE(Contains(shards, "1..256")) << shards;
  const std::string consistency = ErrorOf(R"({"ps": {"consistency": "eventual"}})");
  EXPECT_TRUE(Contains(consistency, "bsp")) << consistency;
  const std::string timeout = ErrorOf(R"({"distributed": {"timeout_s": 0}})");
  EXPECT_TRUE(Contains(timeout, "distributed.timeout_s")) << timeout;
}

TEST(ConfigPsTest, OptimizerPlacementResolves) {
  EXPECT_EQ(Config{}.ps.optimizer, OptimizerPlacement::kAuto);
  EXPECT_FALSE(Config{}.OptimizerOnWorkers());  // codec none: Adam on the shards
  for (const char* codec : {"fp16", "bf16", "int8", "qsgd", "onebit", "topk", "randomk"}) {
    Config c = ParseOk(std::string(R"({"compression": {"codec": ")") + codec + R"("}})");
    EXPECT_TRUE(c.OptimizerOnWorkers()) << codec;
    c.ps.optimizer = OptimizerPlacement::kShard;
    EXPECT_FALSE(c.OptimizerOnWorkers()) << codec;
  }
  const Config worker = ParseOk(R"({"ps": {"optimizer": "worker"}})");
  EXPECT_TRUE(worker.OptimizerOnWorkers());
  EXPECT_EQ(worker.ToJson()["ps"]["optimizer"], "worker");
  const std::string bad = ErrorOf(R"({"ps": {"optimizer": "server"}})");
  EXPECT_TRUE(Contains(bad, "ps.optimizer")) << bad;
  EXPECT_TRUE(Contains(bad, "auto")) << bad;
  EXPECT_TRUE(Contains(bad, "shard")) << bad;
  EXPECT_TRUE(Contains(bad, "worker")) << bad;
}

TEST(ConfigCompressionTest, ErrorFeedbackDefaultFollowsTheCodec) {
  for (const char* codec : {"none", "fp16", "bf16", "int8", "onebit", "topk"}) {
    const Config c = ParseOk(std::string(R"({"compression": {"codec": ")") + codec + R"("}})");
    EXPECT_TRUE(c.compression.error_feedback) << codec;
  }
  for (const char* codec : {"qsgd", "randomk"}) {
    const Config c = ParseOk(std::string(R"({"compression": {"codec": ")") + codec + R"("}})");
    EXPECT_FALSE(c.compression.error_feedback) << codec;
    EXPECT_EQ(c.ToJson()["compression"]["error_feedback"], false) << codec;
    // An explicit value wins, either way.
    const Config on = ParseOk(std::string(R"({"compression": {"error_feedback": true, "codec": ")") + codec + R"("}})");
    EXPECT_TRUE(on.compression.error_feedback) << codec;
  }
  const Config off = ParseOk(R"({"compression": {"codec": "topk", "error_feedback": false}})");
  EXPECT_FALSE(off.compression.error_feedback);
}

TEST(ConfigToJsonTest, RoundTrip) {
  std::vector<Config> configs = {
      ParseOk("{}"), ParseOk(R"({"training": {"seed": 18446744073709551615, "learning_rate": 0.1,
                  "dynamic_resolution": true, "dynamic_resolution_steps": 77},
                  "encoding": {"per_level_scale": 1.3819128799677045},
                  "task": {"type": "nerf", "output": "输出"}})")};
  for (const char* path : {"configs/distributed_small.json", "configs/distributed_medium.json",
                           "configs/distributed_large.json"}) {
    Result<Config> c = Config::LoadFile(path);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    configs.push_back(*c);
  }
  for (const Config& original : configs) {
    const std::string text = original.ToJson().dump(2);
    Result<Config> again = Config::Parse(text, "roundtrip.json");
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
    // Every field, not the printer against itself (only the source name differs).
    Config reparsed = *again;
    reparsed.source = original.source;
    EXPECT_TRUE(reparsed == original) << text;
    EXPECT_EQ(again->training.seed, original.training.seed);
    EXPECT_EQ(again->encoding.per_level_scale, original.encoding.per_level_scale);
    EXPECT_EQ(again->distributed.mp_dim, original.distributed.mp_dim);
  }
}

// --- CheckRunnable -------------------------------------------------------------------------------

TEST(ConfigCheckRunnableTest, DefaultConfigRuns) {
  EXPECT_TRUE(Config{}.CheckRunnable(false).ok());
  EXPECT_TRUE(Config{}.CheckRunnable(true).ok());
}

TEST(ConfigCheckRunnableTest, EverySyncModeRuns) {
  for (const char* sync : {"nccl", "ps", "hybrid"}) {
    const Config c = ParseOk(std::string(R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": ")") +
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
}

TEST(ConfigCheckRunnableTest, PsRunsWithEvenSplitsOnly) {
  EXPECT_TRUE(
      ParseOk(R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": "ps"}})")
          .CheckRunnable(false)
          .ok());
  const Status uneven = ParseOk(R"({"distributed": {"enable": true, "world_size": 3, "gradient_sync": "ps"},
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

}  // namespace
// Issue: text after a NUL byte used to be ignored, so garbage was accepted.
TEST(ConfigHostileTest, NulByteIsRefused) {
  const std::string text = std::string(R"({"training": {"steps": 5}})") + '\0' + "garbage";
  auto c = Config::Parse(text, "nul.json");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Contains(c.status().message(), "NUL")) << c.status().message();
}

// Issue: 100k unknown keys took 9.5 s (a linear duplicate search per key)
// and reported every one. Now: a bounded report naming the count.
TEST(ConfigHostileTest, ManyUnknownKeysGiveABoundedReport) {
  std::string text = R"({"training": {)";
  for (int i = 0; i < 100000; ++i) text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\": 1";
  text += "}}";
  auto c = Config::Parse(text, "many.json");
  ASSERT_FALSE(c.ok());
  const std::string& m = c.status().message();
  EXPECT_TRUE(Contains(m, "99980 more unknown keys")) << m.substr(0, 400);
  EXPECT_LE(std::count(m.begin(), m.end(), '\n'), 25);
}

// A key never silently does nothing: pull compression needs a codec.
TEST(ConfigHostileTest, PullCompressionWithoutACodecIsRefused) {
  auto c = Config::Parse(R"({"compression": {"pull": true}})", "pull.json");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Contains(c.status().message(), "compression.pull")) << c.status().message();
  EXPECT_TRUE(Config::Parse(R"({"compression": {"pull": true, "codec": "onebit"}})", "ok").ok());
}

}  // namespace gridsync
