// Which run a checkpoint's files belong to (common/checkpoint_run.h): the
// manifest names it, a fresh job's parts agree on one through the store, a
// resume refuses parts of different runs and a rejoin files of another run
// than the job's, and a rolled-back shard refuses files put in its place.
#include "common/checkpoint_run.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/checkpoint_files.h"
#include "common/checkpoint_registry.h"
#include "common/sharding.h"
#include "common/store.h"
#include "server/shard_checkpoint.h"
#include "server/shard_store.h"

namespace gridsync {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string TempDir(const char* name) {
  const fs::path dir = fs::temp_directory_path() /
                       (std::string("gridsync-") + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir.string();
}

TEST(CheckpointRunTest, TheManifestNamesTheRunAndAForgedOneIsRefused) {
  const std::string dir = TempDir("run-manifest");
  const nlohmann::json shape = {{"test", 1}};
  const std::string run = NewRunId();
  EXPECT_EQ(run.size(), 32u);
  EXPECT_TRUE(IsRunId(run));
  EXPECT_NE(run, NewRunId());
  ASSERT_TRUE(WriteCheckpointPart(dir, 50, "shard-0", "x", shape, {}, run).ok());
  std::string got = "unset";
  ASSERT_TRUE(ReadCheckpointPart(dir, 50, "shard-0", shape, std::nullopt, &got).ok());
  EXPECT_EQ(got, run);
  // A manifest without one (an older gridsync) reads as "".
  const std::string json = dir + "/step-50/shard-0.json";
  auto manifest = nlohmann::json::parse(std::ifstream(json));
  manifest.erase("run");
  std::ofstream(json) << manifest.dump();
  ASSERT_TRUE(ReadCheckpointPart(dir, 50, "shard-0", shape, std::nullopt, &got).ok());
  EXPECT_EQ(got, "");
  // One step's manifests, as gridsync launch --resume reads them.
  ASSERT_TRUE(WriteCheckpointPart(dir, 60, "shard-0", "x", shape, {}, run).ok());
  ASSERT_TRUE(WriteCheckpointPart(dir, 60, "shard-1", "x", shape, {}, run).ok());
  ASSERT_TRUE(WriteCheckpointPart(dir, 60, "worker-0", "x", shape, {}, run).ok());
  EXPECT_TRUE(CheckStepIsOneRun(dir, 60, {"shard-0", "shard-1", "worker-0", "worker-1"}).ok());
  ASSERT_TRUE(WriteCheckpointPart(dir, 60, "shard-0", "x", shape, {}, "ab").ok());
  const Status mixed = CheckStepIsOneRun(dir, 60, {"shard-0", "shard-1", "worker-0"});
  EXPECT_EQ(mixed.code(), StatusCode::kCheckpointsHeld);
  EXPECT_TRUE(Contains(mixed.message(), "the files of shard-0 (run ab) in " + dir +
                                            "/step-60 belong to another run than those of "
                                            "shard-1, worker-0 (run " +
                                            run + ")"))
      << mixed.message();
  for (const nlohmann::json& bad :
       {nlohmann::json(7), nlohmann::json("../etc"), nlohmann::json(std::string(65, 'a'))}) {
    manifest["run"] = bad;
    std::ofstream(json) << manifest.dump();
    const auto refused = ReadCheckpointPart(dir, 50, "shard-0", shape);
    EXPECT_EQ(refused.status().code(), StatusCode::kCorruption) << bad.dump();
    EXPECT_TRUE(Contains(refused.status().message(), "run is")) << refused.status().message();
  }
  fs::remove_all(dir);
}

TEST(CheckpointRunTest, AFreshJobsPartsTakeTheFirstPartsRun) {
  HashStore store;
  const std::vector<std::string> parts = {"shard-0", "shard-1", "worker-0"};
  // Before the first part made one, the others wait, then name it.
  const auto early = FreshRun(store, 1, parts, "shard-1", milliseconds(10));
  EXPECT_FALSE(early.ok());
  EXPECT_TRUE(Contains(early.status().message(), "which shard-0 publishes"))
      << early.status().message();
  std::thread follower_thread;
  Result<std::string> follower = std::string();
  follower_thread =
      std::thread([&] { follower = FreshRun(store, 1, parts, "worker-0", milliseconds(5000)); });
  const auto first = FreshRun(store, 1, parts, "shard-0", milliseconds(0));
  follower_thread.join();
  ASSERT_TRUE(first.ok() && follower.ok());
  EXPECT_EQ(*follower, *first);
  // Another job, another run.
  const auto next = FreshRun(store, 2, parts, "shard-0", milliseconds(0));
  ASSERT_TRUE(next.ok());
  EXPECT_NE(*next, *first);
  // The ledger asks once and keeps it; without a store its files name none.
  CheckpointLedger ledger("/nonexistent", "shard-1");
  ledger.SetJobParts(parts);
  EXPECT_EQ(*ledger.RunForWriting(&store, 2, milliseconds(0)), *next);
  CheckpointLedger alone("/nonexistent", "shard-1");
  EXPECT_EQ(*alone.RunForWriting(nullptr, 1, milliseconds(0)), "");
}

TEST(CheckpointRunTest, AResumeOfPartsOfDifferentRunsIsRefusedByEveryPart) {
  const std::vector<std::string> parts = {"shard-0", "shard-1", "worker-0"};
  auto resume = [&](const std::vector<std::string>& runs, uint64_t job) {
    HashStore store;
    std::vector<Status> results(parts.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < parts.size(); ++i) {
      threads.emplace_back([&, i] {
        results[i] =
            AgreeOnResumedRun(store, job, 300, parts, parts[i], runs[i], "/ck", milliseconds(5000));
      });
    }
    for (auto& t : threads) t.join();
    return results;
  };
  for (const Status& s : resume({"aa", "aa", "aa"}, 1)) EXPECT_TRUE(s.ok()) << s.ToString();
  for (const Status& s : resume({"", "", ""}, 1)) EXPECT_TRUE(s.ok()) << s.ToString();
  for (const Status& s : resume({"aa", "bb", "aa"}, 1)) {
    EXPECT_EQ(s.code(), StatusCode::kCheckpointsHeld);
    for (const char* want : {"resuming at step 300", "the files of shard-1 (run bb)",
                             "/ck/step-300", "than those of shard-0, worker-0 (run aa)"}) {
      EXPECT_TRUE(Contains(s.message(), want)) << want << " in: " << s.message();
    }
  }
  // A part of an older gridsync (no run) is apart too, and the foreign
  // part is named whichever it is, shard 0 included.
  for (const Status& s : resume({"aa", "aa", ""}, 1)) {
    EXPECT_TRUE(Contains(s.message(), "worker-0 (run none")) << s.message();
  }
  for (const Status& s : resume({"bb", "aa", "aa"}, 1)) {
    EXPECT_TRUE(Contains(s.message(), "the files of shard-0 (run bb)")) << s.message();
  }
  // A hostile store value is not shown whole.
  for (const Status& s : resume({"aa", std::string(5000, 'x'), "aa"}, 1)) {
    EXPECT_TRUE(Contains(s.message(), "(not a run identity)")) << s.message();
    EXPECT_LT(s.message().size(), 1000u);
  }
  // A part that never comes: the wait names it.
  HashStore store;
  const Status alone =
      AgreeOnResumedRun(store, 1, 300, parts, "shard-1", "aa", "/ck", milliseconds(10));
  EXPECT_FALSE(alone.ok());
  EXPECT_TRUE(Contains(alone.message(), "shard-0")) << alone.message();
}

TEST(CheckpointRunTest, ARejoinAndARollbackRefuseAnotherRunsFiles) {
  HashStore store;
  EXPECT_TRUE(CheckRejoinedRun(store, 1, 150, "shard-1", "aa", "/ck").ok())
      << "a coordinator that forgot the run: nothing to compare";
  ASSERT_TRUE(PublishRun(store, 1, "aa").ok());
  EXPECT_TRUE(CheckRejoinedRun(store, 1, 150, "shard-1", "aa", "/ck").ok());
  const Status other = CheckRejoinedRun(store, 1, 150, "shard-1", "bb", "/ck");
  EXPECT_EQ(other.code(), StatusCode::kCheckpointsHeld);
  EXPECT_TRUE(Contains(other.message(), "belong to run bb, the job is run aa")) << other.message();

  // A shard serving run aa rolls back to a step whose file another run wrote.
  const std::string dir = TempDir("run-rollback");
  auto partition = Partition::Make({{"t", 64, 2}}, 1, ModelParallelDim::kRow);
  ASSERT_TRUE(partition.ok());
  ShardStore state(*partition, 0, AdamHyper{});
  ASSERT_TRUE(WriteShardCheckpoint(dir, 0, 50, state, {}, "aa").ok());
  ASSERT_TRUE(WriteShardCheckpoint(dir, 0, 100, state, {}, "bb").ok());
  ShardCheckpoints checkpoints(dir, 0, 50, {"shard-0"}, milliseconds(0));
  checkpoints.SetRegistry(&store);
  checkpoints.Loaded("aa");
  ShardStore restored(*partition, 0, AdamHyper{});
  const Status swapped = checkpoints.RollBack(100, 1, &restored);
  EXPECT_EQ(swapped.code(), StatusCode::kCheckpointsHeld);
  EXPECT_TRUE(Contains(swapped.message(), "names run bb, but this shard serves run aa"))
      << swapped.message();
  EXPECT_TRUE(checkpoints.RollBack(50, 1, &restored).ok());  // its own run's
  fs::remove_all(dir);
}

// A failed write is logged and training goes on, so it is counted for the
// shard's metrics (gridsync_shard_checkpoint_failures_total), and so is
// every written one with the newest step. The first checkpoint of a fresh
// job also makes the job's run (shard 0) and writes it.
TEST(CheckpointRunTest, AShardCountsItsWrittenAndFailedCheckpoints) {
  const std::string dir = TempDir("run-counts");
  auto partition = Partition::Make({{"t", 64, 2}}, 1, ModelParallelDim::kRow);
  ASSERT_TRUE(partition.ok());
  ShardStore state(*partition, 0, AdamHyper{});
  HashStore store;
  ShardCheckpoints checkpoints(dir, 0, 50, {"shard-0"}, milliseconds(0));
  checkpoints.SetRegistry(&store);
  checkpoints.AfterStep(49, 1, state);  // not due
  checkpoints.AfterStep(50, 1, state);
  fs::create_directories(dir);
  std::ofstream(dir + "/step-100") << "a file where the step's folder goes";
  checkpoints.AfterStep(100, 1, state);
  const ShardCheckpoints::Counts counts = checkpoints.counts();
  EXPECT_EQ(counts.written, 1u);
  EXPECT_EQ(counts.failed, 1u);
  EXPECT_EQ(counts.newest_step, 50u);
  std::string run;
  ShardStore restored(*partition, 0, AdamHyper{});
  ASSERT_TRUE(LoadShardCheckpoint(dir, 0, 50, &restored, &run).ok());
  EXPECT_TRUE(IsRunId(run) && run.size() == 32) << run;

  // Two shards of job 2: shard 0 makes the run when the job starts, and
  // shard 1's first checkpoint takes it from the store without waiting.
  const std::vector<std::string> parts = {"shard-0", "shard-1"};
  auto two = Partition::Make({{"t", 64, 2}}, 2, ModelParallelDim::kRow);
  ASSERT_TRUE(two.ok());
  ShardStore second_state(*two, 1, AdamHyper{});
  ShardCheckpoints first(dir, 0, 50, parts, milliseconds(60000));
  ShardCheckpoints second(dir, 1, 50, parts, milliseconds(60000));
  first.SetRegistry(&store);
  second.SetRegistry(&store);
  first.NewJob(2);
  const auto start = std::chrono::steady_clock::now();
  second.AfterStep(250, 2, second_state);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  std::string second_run;
  ShardStore second_restored(*two, 1, AdamHyper{});
  ASSERT_TRUE(LoadShardCheckpoint(dir, 1, 250, &second_restored, &second_run).ok());
  auto published = store.Get({"checkpoint-run/job-2"}, milliseconds(0));
  ASSERT_TRUE(published.ok());
  EXPECT_EQ(second_run, (*published)[0]);
  EXPECT_NE(second_run, run);  // another job, another run
  fs::remove_all(dir);
}

// Shard 0 published step 100 before shard 1 had written it, so it learned
// 50 as the newest step both hold. Kept from that, its step 50 stayed on
// disk through its next write: on a disk for two steps, that write failed,
// and every one after (a hostile probe). It asks again before writing.
TEST(CheckpointRunTest, APartAsksForTheCommonStepAgainBeforeItWrites) {
  const std::string dir = TempDir("run-common");
  const std::vector<std::string> parts = {"shard-0", "shard-1"};
  auto two = Partition::Make({{"t", 64, 2}}, 2, ModelParallelDim::kRow);
  ASSERT_TRUE(two.ok());
  ShardStore first_state(*two, 0, AdamHyper{});
  ShardStore second_state(*two, 1, AdamHyper{});
  HashStore store;
  ShardCheckpoints first(dir, 0, 50, parts, milliseconds(60000));
  ShardCheckpoints second(dir, 1, 50, parts, milliseconds(60000));
  first.SetRegistry(&store);
  second.SetRegistry(&store);
  first.NewJob(1);
  first.AfterStep(50, 1, first_state);
  second.AfterStep(50, 1, second_state);
  first.AfterStep(100, 1, first_state);  // learns 50: shard 1 holds no 100 yet
  second.AfterStep(100, 1, second_state);
  first.AfterStep(150, 1, first_state);
  // Kept: the two newest (100, 150) and the newest both hold (100).
  EXPECT_FALSE(fs::exists(dir + "/step-50/shard-0.bin"));
  EXPECT_TRUE(fs::exists(dir + "/step-100/shard-0.bin"));
  EXPECT_TRUE(fs::exists(dir + "/step-150/shard-0.bin"));
  EXPECT_EQ(first.counts().failed, 0u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gridsync
