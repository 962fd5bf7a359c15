// gridsync launch --resume across machines (tools/launch_resume.h): the
// steps a machine's parts hold intact, the decode of what another launcher
// published (hostile values included), the newest common step, and the
// exchange through a real coordinator on loopback.
#include "tools/launch_resume.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "common/checkpoint_files.h"
#include "common/config.h"
#include "common/coordinator_client.h"
#include "common/wire/curve.h"
#include "server/coordinator.h"
#include "server/coordinator_state.h"
#include "tests/checkpoint_forgery.h"
#include "tests/curve_test_keys.h"
#include "tools/launch_checks.h"

namespace gridsync::launch_detail {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("launch_resume_test." + std::to_string(getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

void Write(const std::string& dir, uint64_t step, const std::string& part) {
  const Status written =
      WriteCheckpointPart(dir, step, part, std::string(4096, static_cast<char>(step)),
                          nlohmann::json{{"tables", 1}}, /*keep=*/{50, 100, 150, 200});
  ASSERT_TRUE(written.ok()) << written.ToString();
}

// One byte of a part's .bin flipped: its checksum fails.
void Damage(const std::string& dir, uint64_t step, const std::string& part) {
  const std::string bin = dir + "/step-" + std::to_string(step) + "/" + part + ".bin";
  std::fstream f(bin, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << bin;
  f.seekp(100);
  f.put('\x5a');
}

TEST(LaunchResumeTest, LocalStepsAreTheCompleteIntactOnesNewestFirst) {
  TempDir dir;
  for (uint64_t step : {50, 100, 150, 200}) {
    Write(dir.str(), step, "shard-1");
    if (step != 150) Write(dir.str(), step, "worker-1");  // 150: incomplete here
  }
  Damage(dir.str(), 200, "worker-1");
  std::vector<DamagedPart> damaged;
  const NodeSteps steps = FindLocalSteps(dir.str(), {"shard-1", "worker-1"}, &damaged);
  EXPECT_TRUE(steps.has_parts);
  EXPECT_EQ(steps.intact, (std::vector<uint64_t>{100, 50}));
  ASSERT_EQ(damaged.size(), 1u);
  EXPECT_EQ(damaged[0].step, 200u);
  EXPECT_EQ(damaged[0].part, "worker-1");
  EXPECT_NE(damaged[0].why.find("checksum"), std::string::npos) << damaged[0].why;
  // Nothing was set aside by looking.
  EXPECT_TRUE(fs::exists(dir.str() + "/step-200/worker-1.bin"));
  // A node of no parts: any step serves it.
  const NodeSteps none = FindLocalSteps(dir.str(), {}, nullptr);
  EXPECT_FALSE(none.has_parts);
  EXPECT_TRUE(none.intact.empty());
}

// A hostile probe: another run's step copied into a folder was resumed
// from, and the resumed job removed the folder's own older steps as
// another run's. The folder's run (its coordinator's state file) decides.
TEST(LaunchResumeTest, AStepOfAnotherRunThanTheFoldersIsPassedOver) {
  TempDir dir;
  const std::string own(32, 'a'), other(32, 'b');
  const auto write = [&](uint64_t step, const std::string& run) {
    const Status written =
        WriteCheckpointPart(dir.str(), step, "shard-0", std::string(4096, 'x'),
                            nlohmann::json{{"tables", 1}}, /*keep=*/{50, 100, 150}, run);
    ASSERT_TRUE(written.ok()) << written.ToString();
  };
  write(50, own);
  write(100, own);
  write(150, other);
  Config config;
  config.checkpoint.dir = dir.str();
  config.training.steps = 1000;
  uint64_t step = 0;
  // No state file: nothing names the folder's run, and the newest step serves.
  ASSERT_EQ(ChooseResumeStep(config, {"shard-0"}, false, &step), 0);
  EXPECT_EQ(step, 150u);
  CoordinatorState state;
  state.run = own;
  ASSERT_TRUE(SaveCoordinatorState(dir.str() + "/coordinator-state.json", state).ok());
  ASSERT_EQ(ChooseResumeStep(config, {"shard-0"}, false, &step), 0);
  EXPECT_EQ(step, 100u);
  EXPECT_TRUE(fs::exists(dir.str() + "/step-150/shard-0.bin"));  // passed over, not removed
  // Across machines the coordinator's machine lists its run's steps alone.
  EXPECT_EQ(FindLocalSteps(dir.str(), {"shard-0"}, nullptr).intact,
            (std::vector<uint64_t>{100, 50}));
  // A folder whose state names a run none of its steps is: refused.
  state.run = std::string(32, 'c');
  ASSERT_TRUE(SaveCoordinatorState(dir.str() + "/coordinator-state.json", state).ok());
  EXPECT_EQ(ChooseResumeStep(config, {"shard-0"}, false, &step), kCheckpointsHeldExitCode);
}

// Under CURVE the launcher checks each part's MAC with its role's key: a
// step forged from an older one (its files copied, the manifest's step
// edited: checksums intact) is passed over and set aside like damage, and
// the resume goes to the newest authentic step. Without CURVE nothing can
// tell it apart (note 67's probe resumed from it).
TEST(LaunchResumeTest, AForgedStepIsPassedOverUnderCurve) {
  TempDir dir;
  const std::string keys = dir.str() + "/keys";
  ASSERT_NO_FATAL_FAILURE(testing::WriteTestKeys(keys, {"shard", "worker"}));
  Config config;
  config.checkpoint.dir = dir.str() + "/ckpt";
  config.training.steps = 1000;
  config.security.curve = true;
  config.security.keys_dir = keys;
  auto shard_key = wire::CheckpointMacKeyFor(config, "shard");
  ASSERT_TRUE(shard_key.ok() && shard_key->has_value()) << shard_key.status().ToString();
  for (uint64_t step : {50, 100}) {
    ASSERT_TRUE(WriteCheckpointPart(config.checkpoint.dir, step, "shard-0", std::string(4096, 'x'),
                                    nlohmann::json{{"tables", 1}}, {50, 100}, "", &**shard_key)
                    .ok());
  }
  const std::string to = config.checkpoint.dir + "/step-150/shard-0";
  nlohmann::json manifest = testing::ForgeStep(config.checkpoint.dir, "shard-0", 100, 150);

  Config plain = config;
  plain.security.curve = false;
  uint64_t step = 0;
  ASSERT_EQ(ChooseResumeStep(plain, {"shard-0"}, false, &step), 0);
  EXPECT_EQ(step, 150u);  // without a key the forgery passes
  ASSERT_EQ(ChooseResumeStep(config, {"shard-0"}, false, &step), 0);
  EXPECT_EQ(step, 100u);
  EXPECT_TRUE(fs::exists(to + ".json.damaged"));
  EXPECT_FALSE(fs::exists(to + ".json"));
  // Across machines each launcher lists only the authentic steps (the
  // forgery made again: the choice above set it aside).
  testing::ForgeStep(config.checkpoint.dir, "shard-0", 100, 150);
  EXPECT_EQ(FindLocalSteps(config.checkpoint.dir, {"shard-0"}, nullptr).intact,
            (std::vector<uint64_t>{150, 100, 50}));  // without the keys
  std::vector<DamagedPart> damaged;
  EXPECT_EQ(
      FindLocalSteps(config.checkpoint.dir, {"shard-0"}, &damaged, LaunchMacKeys(config)).intact,
      (std::vector<uint64_t>{100, 50}));
  ASSERT_EQ(damaged.size(), 1u);
  EXPECT_NE(damaged[0].why.find("its mac does not match"), std::string::npos) << damaged[0].why;
  // A forgery whose mac was stripped is damage as well: it does not stand
  // for every process to refuse at start.
  manifest.erase("mac");
  std::ofstream(to + ".json") << manifest.dump();
  damaged.clear();
  EXPECT_EQ(
      FindLocalSteps(config.checkpoint.dir, {"shard-0"}, &damaged, LaunchMacKeys(config)).intact,
      (std::vector<uint64_t>{100, 50}));
  ASSERT_EQ(damaged.size(), 1u);
  EXPECT_NE(damaged[0].why.find("no mac, while security.curve is on"), std::string::npos)
      << damaged[0].why;
}

// A hostile probe resumed with another seed and learning rate without a
// word: the manifests check the model's shape alone.
TEST(LaunchResumeTest, AResumeSaysWhatChangedSinceTheRunsLaunch) {
  TempDir dir;
  Config config;
  config.checkpoint.dir = dir.str() + "/ckpt";        // made by the record
  EXPECT_TRUE(ResumedConfigChanges(config).empty());  // no record: nothing to say
  RecordLaunchConfig(config);
  EXPECT_TRUE(ResumedConfigChanges(config).empty());
  Config changed = config;
  changed.training.seed = 7;
  changed.training.steps = config.training.steps * 2;
  const std::vector<std::string> changes = ResumedConfigChanges(changed);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_NE(changes[0].find("training.seed " + std::to_string(config.training.seed) + " -> 7"),
            std::string::npos)
      << changes[0];
  EXPECT_NE(changes[1].find("training.steps"), std::string::npos) << changes[1];
  // A record that is no JSON object is named, not trusted.
  std::ofstream(config.checkpoint.dir + "/launch-config.json") << "[1,";
  ASSERT_EQ(ResumedConfigChanges(config).size(), 1u);
  EXPECT_NE(ResumedConfigChanges(config)[0].find("does not parse"), std::string::npos);
  // Nor is one nested a million deep (the config reader's depth bound).
  std::ofstream(config.checkpoint.dir + "/launch-config.json") << std::string(1 << 20, '[');
  ASSERT_EQ(ResumedConfigChanges(config).size(), 1u);
  // A folder where the record should be is named, not taken for none.
  fs::remove(config.checkpoint.dir + "/launch-config.json");
  fs::create_directories(config.checkpoint.dir + "/launch-config.json");
  ASSERT_EQ(ResumedConfigChanges(config).size(), 1u);
  EXPECT_NE(ResumedConfigChanges(config)[0].find("nothing to compare with"), std::string::npos);
}

TEST(LaunchResumeTest, TheNewestStepEveryNodeWithPartsHolds) {
  const NodeSteps a{true, {150, 100}}, b{true, {100, 50}}, c{false, {}}, d{true, {}, true};
  EXPECT_EQ(NewestCommonStep({a, b, c}), 100u);
  EXPECT_EQ(NewestCommonStep({a, a}), 150u);
  EXPECT_EQ(NewestCommonStep({b, a}), 100u);  // the order does not matter
  EXPECT_EQ(NewestCommonStep({a, d}), 0u);    // a node with parts and no step
  EXPECT_EQ(NewestCommonStep({c, c}), 0u);    // nothing checkpoints
  EXPECT_EQ(NewestCommonStep({a, NodeSteps{true, {200}}}), 0u);
  EXPECT_EQ(DescribeNodeSteps({"a", "b", "c", "d"}, {a, b, c, d}),
            "a: 150, 100; b: 100, 50; c: any step (no part checkpoints there); d: no intact "
            "complete step");
}

TEST(LaunchResumeTest, WhatALauncherPublishesDecodesBack) {
  for (const NodeSteps& steps :
       {NodeSteps{true, {300, 250}}, NodeSteps{true, {}}, NodeSteps{false, {}}}) {
    auto back = DecodeNodeSteps(EncodeNodeSteps(steps), "a");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->has_parts, steps.has_parts);
    EXPECT_EQ(back->intact, steps.intact);
  }
}

// The store is writable by any observer: a value no launcher writes is
// refused, naming the node and what is allowed, never trusted or crashed on.
TEST(LaunchResumeTest, AHostileValueIsRefusedNamingTheNode) {
  std::string many = "{\"parts\": true, \"damaged\": false, \"steps\": [";
  for (int i = 1; i <= 33; ++i) {
    if (i > 1) many += ",";
    many += std::to_string(i);
  }
  many += "]}";
  const char* const bad[] = {
      "",
      "null",
      "[150]",
      "{\"parts\": true}",
      "{\"parts\": true, \"steps\": [150], \"more\": 1}",
      "{\"parts\": 1, \"steps\": [150]}",
      "{\"parts\": true, \"steps\": 150}",
      "{\"parts\": true, \"steps\": [0]}",
      "{\"parts\": true, \"steps\": [-150]}",
      "{\"parts\": true, \"steps\": [1.5]}",
      "{\"parts\": true, \"steps\": [\"150\"]}",
      "{\"parts\": true, \"steps\": [150, 150]}",
      "{\"parts\": false, \"steps\": [150]}",
      "{\"parts\": true, \"steps\": [18446744073709551616]}",
      "{\"parts\": true, \"steps\": [[[[[[[[[[[[[[[[[[[[150]]]]]]]]]]]]]]]]]]]]}",
      "\xff\xfe{",
      "{\"parts\": true, \"steps\": [150], \"damaged\": 0}",
      "{\"parts\": false, \"steps\": [], \"damaged\": true}",
      "{\"parts\": true, \"steps\": [150], \"damaged\": false, \"x\": 1}",
  };
  for (const std::string value : bad) {
    auto decoded = DecodeNodeSteps(value, "node-b");
    ASSERT_FALSE(decoded.ok()) << "accepted: " << value;
    EXPECT_EQ(decoded.status().code(), StatusCode::kCorruption);
    EXPECT_NE(decoded.status().message().find("the launcher of node node-b published"),
              std::string::npos)
        << decoded.status().message();
    EXPECT_NE(decoded.status().message().find("allowed:"), std::string::npos);
  }
  for (const std::string value :
       {"", "{}", "{\"step\": 150}", "{\"step\": -1, \"refused\": 0}",
        "{\"step\": 150, \"refused\": 256}", "{\"step\": 150, \"refused\": -3}",
        "{\"step\": 150, \"refused\": 3, \"x\": 1}", "{\"step\": \"150\", \"refused\": 0}"}) {
    auto decoded = DecodeVerdict(value, "node-b");
    ASSERT_FALSE(decoded.ok()) << "accepted: " << value;
    EXPECT_NE(decoded.status().message().find("the launcher of node node-b published"),
              std::string::npos)
        << decoded.status().message();
  }
  auto refused = DecodeNodeSteps(many, "b");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("more steps than allowed"), std::string::npos);
  // Control bytes are not echoed as they are (a terminal would act on them).
  auto escaped = DecodeNodeSteps("\x1b[2J\x07", "b");
  ASSERT_FALSE(escaped.ok());
  EXPECT_EQ(escaped.status().message().find('\x1b'), std::string::npos);
  EXPECT_NE(escaped.status().message().find("'\\x1b[2J\\x07'"), std::string::npos)
      << escaped.status().message();
  // A long value is quoted cut short.
  auto long_value = DecodeNodeSteps(std::string(100000, 'x'), "b");
  ASSERT_FALSE(long_value.ok());
  EXPECT_LT(long_value.status().message().size(), 1000u);
}

Config TwoNodes(uint16_t port) {
  Config config;
  config.distributed.enable = true;
  config.distributed.master_port = port;
  config.distributed.timeout_s = 2;
  config.layout.nodes.resize(2);
  config.layout.nodes[0].name = "a";
  config.layout.nodes[1].name = "b";
  return config;
}

// Two launchers through a real coordinator: each gets both lists, in the
// layout's order, whichever published first.
TEST(LaunchResumeTest, TwoLaunchersExchangeTheirStepsThroughTheCoordinator) {
  auto coordinator = Coordinator::Start(CoordinatorOptions{});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const Config config = TwoNodes((*coordinator)->port());
  std::vector<NodeSteps> seen_by_b;
  Status b_status;
  std::thread b([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a waits for b
    b_status = ExchangeResumeSteps(config, "b", NodeSteps{true, {100, 50}}, &seen_by_b);
  });
  std::vector<NodeSteps> seen_by_a;
  const Status a_status = ExchangeResumeSteps(config, "a", NodeSteps{true, {150, 100}}, &seen_by_a);
  b.join();
  ASSERT_TRUE(a_status.ok()) << a_status.ToString();
  ASSERT_TRUE(b_status.ok()) << b_status.ToString();
  for (const auto* seen : {&seen_by_a, &seen_by_b}) {
    ASSERT_EQ(seen->size(), 2u);
    EXPECT_EQ((*seen)[0].intact, (std::vector<uint64_t>{150, 100}));
    EXPECT_EQ((*seen)[1].intact, (std::vector<uint64_t>{100, 50}));
    EXPECT_EQ(NewestCommonStep(*seen), 100u);
  }
  // The verdicts' round the same way.
  std::vector<ResumeVerdict> verdicts_b;
  std::thread vb([&] {
    ASSERT_TRUE(ExchangeVerdicts(config, "b", ResumeVerdict{100, 3}, &verdicts_b).ok());
  });
  std::vector<ResumeVerdict> verdicts_a;
  ASSERT_TRUE(ExchangeVerdicts(config, "a", ResumeVerdict{100, 0}, &verdicts_a).ok());
  vb.join();
  for (const auto* seen : {&verdicts_a, &verdicts_b}) {
    ASSERT_EQ(seen->size(), 2u);
    EXPECT_EQ((*seen)[0].refused, 0);
    EXPECT_EQ((*seen)[1].refused, 3);
    EXPECT_EQ((*seen)[1].step, 100u);
  }
}

// A launcher alone: within distributed.timeout_s, quoting who came; and
// lists an earlier attempt left in the store (a coordinator that outlived
// it) are never read for a launcher that did not come this time.
TEST(LaunchResumeTest, AMissingLauncherIsNotStoodInForByAnEarlierAttempt) {
  auto coordinator = Coordinator::Start(CoordinatorOptions{});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const Config config = TwoNodes((*coordinator)->port());
  // Attempt 1: both came.
  std::vector<NodeSteps> seen_by_b;
  std::thread b([&] {
    ASSERT_TRUE(ExchangeResumeSteps(config, "b", NodeSteps{true, {100}}, &seen_by_b).ok());
  });
  std::vector<NodeSteps> all;
  ASSERT_TRUE(ExchangeResumeSteps(config, "a", NodeSteps{true, {150, 100}}, &all).ok());
  b.join();
  // Attempt 2: node a alone, with b's list of attempt 1 still in the store.
  const auto start = std::chrono::steady_clock::now();
  const Status alone = ExchangeResumeSteps(config, "a", NodeSteps{true, {150}}, &all);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(alone.ok()) << "node b's list of an earlier attempt stood in for it";
  EXPECT_EQ(alone.code(), StatusCode::kTimeout) << alone.ToString();
  EXPECT_NE(alone.message().find("1 of 2 arrived (launcher of node a)"), std::string::npos)
      << alone.message();
  EXPECT_NE(alone.message().find("--resume --node NAME on every machine"), std::string::npos);
  EXPECT_LT(took, std::chrono::seconds(10));
}

// `stop` ends a wait within about a second (an interrupt of the launcher).
TEST(LaunchResumeTest, StopEndsTheWaitWithinASecond) {
  auto coordinator = Coordinator::Start(CoordinatorOptions{});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  Config config = TwoNodes((*coordinator)->port());
  config.distributed.timeout_s = 60;
  const auto start = std::chrono::steady_clock::now();
  std::vector<ResumeVerdict> all;
  const Status stopped = ExchangeVerdicts(config, "a", ResumeVerdict{150, 0}, &all, [&] {
    return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(300);
  });
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.message(), "stopped");
  EXPECT_LT(took, std::chrono::seconds(3));
}

}  // namespace
}  // namespace gridsync::launch_detail
