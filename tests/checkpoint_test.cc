// Shard checkpoints (server/shard_checkpoint.h): a partition's state round
// trips exactly; a step is complete only when every shard's manifest exists;
// a crash mid-write (a .tmp file) leaves the previous step in use; corrupted
// or mismatched data is refused naming the file. The multi-process fault
// test (kill a shard, resume) is tests/fault_test.sh.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/checkpoint_registry.h"
#include "common/sharding.h"
#include "common/store.h"
#include "kernels/cpu/error_feedback.h"
#include "server/shard_checkpoint.h"
#include "server/shard_store.h"
#include "tests/test_util.h"
#include "worker/worker_adam.h"

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

// Writers of one path at once (two launchers in one folder, a shard and a
// tool): each writes a temporary file of its own, so the file is always one
// writer's bytes whole, never a mix, and no temporary file stays behind.
TEST(WriteFileAtomicallyTest, WritersOfOnePathAtOnceEachLeaveAWholeFile) {
  const std::string dir = ::testing::TempDir() + "/atomic_writers";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = dir + "/launch-config.json";
  constexpr int kWriters = 4;
  std::vector<std::string> contents;
  for (int w = 0; w < kWriters; ++w)
    contents.push_back(std::string(1 << 20, static_cast<char>('a' + w)));
  std::vector<std::thread> writers;
  std::vector<int> failures(kWriters, 0);
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (int i = 0; i < 20; ++i)
        failures[w] += WriteFileAtomically(path, contents[w]).ok() ? 0 : 1;
    });
  }
  // Reads meanwhile see an old version or a new one, whole.
  for (int i = 0; i < 50; ++i) {
    std::ifstream in(path, std::ios::binary);
    if (!in) continue;
    const std::string got((std::istreambuf_iterator<char>(in)), {});
    ASSERT_EQ(got.size(), size_t{1} << 20) << "read " << i;
    ASSERT_EQ(got.find_first_not_of(got[0]), std::string::npos) << "a mix of writers, read " << i;
  }
  for (auto& t : writers) t.join();
  for (int w = 0; w < kWriters; ++w) EXPECT_EQ(failures[w], 0) << "writer " << w;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"launch-config.json"});
  fs::remove_all(dir);
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
  EXPECT_EQ(LatestCompleteStep(dir, CheckpointParts(2, 0)), 0u)
      << "shard 1 has not written step 50";
  ASSERT_TRUE(WriteShardCheckpoint(dir, 1, 50, b).ok());
  EXPECT_EQ(LatestCompleteStep(dir, CheckpointParts(2, 0)), 50u);

  // A crash while writing step 100: a temporary file, no manifest.
  fs::create_directories(dir + "/step-100");
  std::ofstream(dir + "/step-100/shard-0.bin.tmp") << "half written";
  EXPECT_EQ(LatestCompleteStep(dir, CheckpointParts(2, 0)), 50u);

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

  // Step counts above the checkpoint's step cannot come from training (a row
  // steps at most once a step): refused, naming the row, whatever the
  // checksum says.
  std::string state;
  a.AppendState(&state);  // every trained row has stepped twice
  ShardStore forged(f.partition, 0, f.hyper);
  const Status beyond = forged.RestoreState(state, 1);
  EXPECT_EQ(beyond.code(), StatusCode::kInvalidArgument) << beyond.ToString();
  EXPECT_NE(beyond.message().find("step count 2, beyond the checkpoint's step 1"),
            std::string::npos)
      << beyond.ToString();
  EXPECT_TRUE(forged.RestoreState(state, 2).ok());

  // Only the two newest checkpoints of a shard are kept.
  ASSERT_TRUE(WriteShardCheckpoint(dir, 0, 150, a).ok());
  ASSERT_TRUE(WriteShardCheckpoint(dir, 0, 200, a).ok());
  EXPECT_FALSE(fs::exists(dir + "/step-50/shard-0.bin"));
  EXPECT_TRUE(fs::exists(dir + "/step-200/shard-0.json"));
  fs::remove_all(dir);
}

TEST(CheckpointTest, WorkerStateRoundTripsAndStepsNeedEveryWorkerWithState) {
  // Error feedback and Adam on the worker: a client holding both, filled
  // through the codec's own path, saved and restored into a fresh one.
  Config config = testing::SmallDistributedConfig(1, GradientSyncMode::kPs, 4);
  config.compression.codec = "topk";
  config.compression.ratio = 0.05;
  config.compression.min_bytes = 0;
  const RunSpec spec = testing::SpecOf(config);
  ASSERT_TRUE(spec.sync.worker_state);
  const Partition partition = *Partition::Make(spec.model.tables, 2, ModelParallelDim::kRow);
  cpu::ErrorFeedback feedback;
  std::vector<uint32_t> rows = {3, 9, 40};  // level 0 has 8 x 8 rows or more
  std::vector<float> corrected(rows.size() * 2), decoded(rows.size() * 2, 0.0f);
  for (size_t i = 0; i < corrected.size(); ++i) corrected[i] = 0.25f * static_cast<float>(i + 1);
  feedback.StoreResidual(uint64_t{5} << 32, rows.data(), rows.size(), 2, corrected.data(),
                         decoded.data());
  std::string saved;
  feedback.AppendState(&saved);
  cpu::ErrorFeedback restored;
  std::string_view in = saved;
  ASSERT_TRUE(restored.RestoreState(&in).ok());
  EXPECT_TRUE(in.empty());
  std::string again;
  restored.AppendState(&again);
  EXPECT_EQ(again, saved);
  ASSERT_NE(restored.Residual(uint64_t{5} << 32, 9), nullptr);
  EXPECT_EQ(restored.Residual(uint64_t{5} << 32, 9)[1], 1.0f);
  // Truncated or repeated states are refused, never read past their end.
  for (size_t cut = 0; cut < saved.size(); ++cut) {
    cpu::ErrorFeedback partial;
    std::string_view part(saved.data(), cut);
    EXPECT_FALSE(partial.RestoreState(&part).ok()) << "cut at " << cut;
  }

  WorkerAdam adam(partition, spec.model.adam);
  std::vector<float> grad(rows.size() * 2, 0.5f);
  adam.ToUpdates({{0, false, rows.data(), rows.size(), grad.data()}});
  std::string adam_state;
  adam.AppendState(&adam_state);
  WorkerAdam fresh(partition, spec.model.adam);
  std::string_view adam_in = adam_state;
  std::string_view early = adam_state;
  const Status beyond = WorkerAdam(partition, spec.model.adam).RestoreState(&early, 0);
  EXPECT_EQ(beyond.code(), StatusCode::kInvalidArgument) << beyond.ToString();
  EXPECT_NE(beyond.message().find("row 3 has Adam step count 1"), std::string::npos)
      << beyond.ToString();
  ASSERT_TRUE(fresh.RestoreState(&adam_in, 1).ok());
  EXPECT_TRUE(adam_in.empty());
  // Both take the same next step.
  const auto a = adam.ToUpdates({{0, false, rows.data(), rows.size(), grad.data()}});
  const auto b = fresh.ToUpdates({{0, false, rows.data(), rows.size(), grad.data()}});
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  for (size_t i = 0; i < rows.size() * 2; ++i) EXPECT_EQ(a[0].values[i], b[0].values[i]);

  // A step is complete only with every worker's part when workers hold state.
  const std::string dir =
      (fs::temp_directory_path() / ("gridsync-wckpt-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const nlohmann::json shape = {{"test", 1}};
  for (const char* part : {"shard-0", "shard-1", "worker-0"})
    ASSERT_TRUE(WriteCheckpointPart(dir, 10, part, "x", shape).ok());
  EXPECT_EQ(LatestCompleteStep(dir, CheckpointParts(2, 0)), 10u);
  EXPECT_EQ(LatestCompleteStep(dir, CheckpointParts(2, 2)), 0u) << "worker 1 has not written";
  ASSERT_TRUE(WriteCheckpointPart(dir, 10, "worker-1", "y", shape).ok());
  EXPECT_EQ(LatestCompleteStep(dir, CheckpointParts(2, 2)), 10u);
  EXPECT_EQ(*ReadCheckpointPart(dir, 10, "worker-1", shape), "y");
  EXPECT_EQ(ReadCheckpointPart(dir, 10, "worker-1", {{"test", 2}}).status().code(),
            StatusCode::kInvalidArgument);
  fs::remove_all(dir);
}

// fault_test 4b on a fast host: the coordinator was killed after step 150;
// the shards wrote 200 and 250 before they noticed, could not publish
// them, and keeping only the two newest removed 150, the newest step the
// coordinator knew every part held: restarted, none could rejoin. What the
// coordinator last acknowledged (the ledger's published list) now stays on
// disk until a newer list is acknowledged.
// A coordinator that is gone: every request fails, as CoordinatorStore's do.
class GoneStore : public Store {
 public:
  Status Set(const std::string&, const std::string&) override {
    return Status::IOError("kvSet: the coordinator closed the connection");
  }
  Result<std::vector<std::string>> Get(const std::vector<std::string>&,
                                       std::chrono::milliseconds) override {
    return Status::IOError("kvGet: the coordinator closed the connection");
  }
};

TEST(CheckpointTest, StepsTheCoordinatorLastAcknowledgedStayOnDisk) {
  const std::string dir =
      (fs::temp_directory_path() / ("gridsync-keep-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  HashStore registry;
  GoneStore gone;
  CheckpointLedger ledger(dir, "shard-0");
  const nlohmann::json shape = {{"test", 1}};
  const auto write = [&](uint64_t step, Store& store) {
    ASSERT_TRUE(WriteCheckpointPart(dir, step, "shard-0", "x", shape, ledger.MustKeep()).ok());
    ledger.Wrote(step);
    (void)ledger.Publish(store, 1);
  };
  for (uint64_t step : {50, 100, 150}) write(step, registry);
  EXPECT_EQ(HeldSteps(dir, "shard-0"), (std::vector<uint64_t>{100, 150}));
  // The coordinator is gone: 200 and 250 are written, never acknowledged;
  // 150, the newest it acknowledged, stays (100 went with the write of 200,
  // made while the last publish had succeeded).
  write(200, gone);
  write(250, gone);
  EXPECT_EQ(HeldSteps(dir, "shard-0"), (std::vector<uint64_t>{150, 200, 250}));
  auto newest = NewestCommonStep(registry, 1, {"shard-0"});
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(*newest, 150u);
  // A third unacknowledged step: still those, and the newest two.
  write(300, gone);
  EXPECT_EQ(HeldSteps(dir, "shard-0"), (std::vector<uint64_t>{150, 250, 300}));
  // Acknowledged again: the next write keeps the newest two only.
  write(350, registry);
  write(400, registry);
  EXPECT_EQ(HeldSteps(dir, "shard-0"), (std::vector<uint64_t>{350, 400}));
  fs::remove_all(dir);
}

// A fresh job's first checkpoint would remove another run's steps
// (WriteCheckpointPart keeps one older step of the part's current history),
// so a fresh start into a folder holding any of its parts' steps is refused,
// naming them; parts that hold nothing there start freely.
// A hostile probe: shard 1's disk filled up from step 150 (its writes
// failed, logged, and training went on), while shard 0 wrote 250 and 300
// and removed its 50 and 100: no step was complete any more, so neither a
// restarted shard 1 nor `gridsync launch --resume` had anything to start
// from. The newest step every part holds now stays.
TEST(CheckpointTest, TheNewestStepEveryPartHoldsStaysWhileAnotherPartCannotWrite) {
  const std::string dir =
      (fs::temp_directory_path() / ("gridsync-common-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  HashStore registry;
  const std::vector<std::string> parts = {"shard-0", "shard-1"};
  CheckpointLedger first(dir, "shard-0"), second(dir, "shard-1");
  first.SetJobParts(parts);
  second.SetJobParts(parts);
  const nlohmann::json shape = {{"test", 1}};
  const auto write = [&](CheckpointLedger& ledger, uint64_t step) {
    ASSERT_TRUE(WriteCheckpointPart(dir, step, ledger.part(), "x", shape, ledger.MustKeep()).ok());
    ledger.Wrote(step);
    ASSERT_TRUE(ledger.Publish(registry, 1).ok());
  };
  for (uint64_t step : {50, 100}) {
    write(first, step);
    write(second, step);
  }
  for (uint64_t step : {150, 200, 250, 300}) write(first, step);  // shard 1 writes nothing
  EXPECT_EQ(HeldSteps(dir, "shard-0"), (std::vector<uint64_t>{100, 250, 300}));
  EXPECT_EQ(LatestCompleteStep(dir, parts), 100u);
  auto common = NewestCommonStep(registry, 1, parts);
  ASSERT_TRUE(common.ok()) << common.status().ToString();
  EXPECT_EQ(*common, 100u);
  // Shard 1 writes again: once both hold 350, the old step may go.
  write(second, 350);
  write(first, 350);
  write(first, 400);
  EXPECT_EQ(HeldSteps(dir, "shard-0"), (std::vector<uint64_t>{350, 400}));
  EXPECT_EQ(LatestCompleteStep(dir, parts), 350u);
  fs::remove_all(dir);
}

TEST(CheckpointTest, AFreshStartNeverDeletesAnotherRunsCheckpoints) {
  const std::string dir =
      (fs::temp_directory_path() / ("gridsync-fresh-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const std::vector<std::string> job = {"shard-0", "shard-1"};
  EXPECT_TRUE(CheckFreshStart(dir, {"shard-0", "worker-0"}, job).ok()) << "no folder yet";
  const nlohmann::json shape = {{"test", 1}};
  for (uint64_t step : {50, 100}) {
    for (const char* part : {"shard-0", "shard-1"})
      ASSERT_TRUE(WriteCheckpointPart(dir, step, part, "x", shape).ok());
  }
  ASSERT_TRUE(WriteCheckpointPart(dir, 150, "shard-1", "x", shape).ok());  // shard 0 died first
  EXPECT_TRUE(CheckFreshStart(dir, {"shard-2", "worker-0"}, job).ok())
      << "parts with no files there";
  const Status refused = CheckFreshStart(dir, {"shard-0", "shard-1", "worker-0"}, job);
  EXPECT_EQ(refused.code(), StatusCode::kCheckpointsHeld);
  for (const char* want :
       {"checkpoint.dir", "shard-0 (step 50, 100)", "shard-1 (step 100, 150)",
        "resume it from step 100", "--resume-step 100", "move the folder away"}) {
    EXPECT_NE(refused.message().find(want), std::string::npos)
        << want << " in: " << refused.message();
  }
  // A run that finished at its training.steps (100) has nothing left to
  // resume: said so, with the way on (a resume was advised, and refused).
  const Status finished = CheckFreshStart(dir, {"shard-0"}, job, /*run_steps=*/100);
  for (const char* want : {"that run finished", "raise training.steps", "move the folder away"})
    EXPECT_NE(finished.message().find(want), std::string::npos)
        << want << " in: " << finished.message();
  EXPECT_EQ(finished.message().find("resume it from step"), std::string::npos)
      << finished.message();
  // Still short of it: the resume is offered.
  EXPECT_NE(CheckFreshStart(dir, {"shard-0"}, job, 300).message().find("resume it from step 100"),
            std::string::npos);
  // A damaged newest complete step (shard-0's .bin of step 100 flipped):
  // no --resume-step 100 is offered (the units would fail on the file), and
  // the damage is named; shard-1 no longer holds step 50, so no older step
  // is offered either.
  {
    const std::string bin = dir + "/step-100/shard-0.bin";
    std::string data;
    {
      std::ifstream in(bin, std::ios::binary);
      data.assign(std::istreambuf_iterator<char>(in), {});
    }
    ASSERT_FALSE(data.empty());
    data[0] = static_cast<char>(data[0] ^ 0x5a);
    std::ofstream(bin, std::ios::binary | std::ios::trunc) << data;
    const Status damaged = CheckFreshStart(dir, {"shard-0", "shard-1", "worker-0"}, job);
    for (const char* want : {"step 100 holds every part of the job, but", "shard-0.bin", "checksum",
                             "no older step holds every part intact"}) {
      EXPECT_NE(damaged.message().find(want), std::string::npos)
          << want << " in: " << damaged.message();
    }
    EXPECT_EQ(damaged.message().find("--resume-step"), std::string::npos) << damaged.message();
    data[0] = static_cast<char>(data[0] ^ 0x5a);
    std::ofstream(bin, std::ios::binary | std::ios::trunc) << data;
  }
  // No step every part of the job holds here: no resume offered.
  const Status partial = CheckFreshStart(dir, {"shard-0"}, {"shard-0", "shard-1", "worker-0"});
  EXPECT_NE(partial.message().find("no resume from this folder alone"), std::string::npos)
      << partial.message();
  // Refusing touched nothing.
  EXPECT_EQ(HeldSteps(dir, "shard-0"), (std::vector<uint64_t>{50, 100}));
  EXPECT_EQ(HeldSteps(dir, "shard-1"), (std::vector<uint64_t>{100, 150}));
  fs::remove_all(dir);
}

// Which checkpoints the coordinator knows: a store with no key for the part
// in job 1 (a coordinator that restarted) knows none; a part that published
// its steps in job 1, or any job from 2 on, is known. A fresh start is
// refused over files it does not know, and only those.
TEST(CheckpointRegistryTest, TheCoordinatorKnowsTheCheckpointsOfItsJobs) {
  HashStore store;
  auto knows = [&](uint64_t job, const char* part) {
    auto known = CoordinatorKnowsCheckpoints(store, job, part);
    EXPECT_TRUE(known.ok()) << known.status().ToString();
    return known.ok() && *known;
  };
  EXPECT_FALSE(knows(1, "shard-0"));
  EXPECT_TRUE(knows(2, "shard-0"));
  ASSERT_TRUE(store.Set(CheckpointKey(1, "shard-1"), "50").ok());
  EXPECT_TRUE(knows(1, "shard-1"));
  EXPECT_FALSE(knows(1, "shard-0"));
  ASSERT_TRUE(store.Set(CheckpointKey(1, "shard-0"), "").ok());  // published, none left
  EXPECT_FALSE(knows(1, "shard-0"));

  // What a shard or a worker holding state runs when it starts afresh.
  const std::string dir =
      (fs::temp_directory_path() / ("gridsync-against-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const std::vector<std::string> job = {"shard-0", "worker-0"};
  EXPECT_TRUE(CheckFreshStartAgainst(store, 1, dir, "worker-0", job).ok()) << "no files";
  ASSERT_TRUE(WriteCheckpointPart(dir, 50, "worker-0", "x", {{"test", 1}}).ok());
  const Status stranger = CheckFreshStartAgainst(store, 1, dir, "worker-0", job);
  EXPECT_EQ(stranger.code(), StatusCode::kCheckpointsHeld);
  EXPECT_NE(stranger.message().find("worker-0: the coordinator knows no job of these checkpoints"),
            std::string::npos)
      << stranger.message();
  EXPECT_TRUE(CheckFreshStartAgainst(store, 2, dir, "worker-0", job).ok()) << "an earlier job's";
  ASSERT_TRUE(store.Set(CheckpointKey(1, "worker-0"), "50").ok());
  EXPECT_TRUE(CheckFreshStartAgainst(store, 1, dir, "worker-0", job).ok()) << "this job's";
  EXPECT_EQ(HeldSteps(dir, "worker-0"), std::vector<uint64_t>{50});
  fs::remove_all(dir);
}

TEST(CheckpointTest, RefusedWhereNoStepIsOneStateOfTheJob) {
  for (const char* extra : {R"("ps": {"consistency": "async"})"}) {
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
  // The workers' own state is checkpointed too: codecs, delta pulls (both
  // ends keep their replicas) and Adam on the workers run with checkpoints.
  for (const char* extra : {R"("compression": {"codec": "onebit"})",
                            R"("compression": {"codec": "onebit", "pull": true})",
                            R"("ps": {"optimizer": "worker"})", R"("task": {"type": "image"})"}) {
    auto c = Config::Parse(std::string(R"({"distributed": {"enable": true, "gradient_sync": "ps"},
        "checkpoint": {"every_steps": 10}, )") +
                               extra + "}",
                           "ckpt");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_TRUE(c->CheckRunnable(false).ok())
        << extra << ": " << c->CheckRunnable(false).ToString();
  }
  auto plain = Config::Parse(R"({"distributed": {"enable": true, "gradient_sync": "ps"},
      "checkpoint": {"every_steps": 10}, "task": {"output": "/tmp/x"}})",
                             "ckpt");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->CheckRunnable(false).ok());
  EXPECT_EQ(plain->checkpoint.dir, "/tmp/x/checkpoints");
}

TEST(CheckpointRegistryTest, TheNewestStepEveryPartHoldsIsFoundAndGarbageIsRefused) {
  const std::string dir =
      (fs::temp_directory_path() / ("gridsync-registry-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  HashStore store;
  // Nothing published: nothing to rejoin from.
  auto none = NewestCommonStep(store, 1, {"shard-0", "shard-1"});
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(*none, 0u);
  // An earlier run left step 900 in the same folder: the first step this
  // run writes removes it (another history's), and it is never published.
  ASSERT_TRUE(WriteCheckpointPart(dir, 900, "shard-0", "old", {1}).ok());
  // Parts of this job: shard-0 writes 100 and 150, shard-1 100, 150 and 200
  // (shard-0 died before writing 200).
  CheckpointLedger shard0(dir, "shard-0"), shard1(dir, "shard-1");
  for (uint64_t step : {100, 150}) {
    ASSERT_TRUE(WriteCheckpointPart(dir, step, "shard-0", "a", {1}).ok());
    shard0.Wrote(step);
  }
  EXPECT_EQ(HeldSteps(dir, "shard-0"), (std::vector<uint64_t>{100, 150})) << "900 was left";
  for (uint64_t step : {100, 150, 200}) {
    ASSERT_TRUE(WriteCheckpointPart(dir, step, "shard-1", "b", {1}).ok());
    shard1.Wrote(step);
  }
  EXPECT_EQ(HeldSteps(dir, "shard-1"), (std::vector<uint64_t>{150, 200}));  // two newest kept
  ASSERT_TRUE(shard0.Publish(store, 1).ok());
  ASSERT_TRUE(shard1.Publish(store, 1).ok());
  auto published = store.Get({CheckpointKey(1, "shard-1")}, std::chrono::milliseconds(0));
  ASSERT_TRUE(published.ok());
  EXPECT_EQ(published->at(0), "150,200") << "steps no longer on disk are not offered";
  auto common = NewestCommonStep(store, 1, {"shard-0", "shard-1"});
  ASSERT_TRUE(common.ok()) << common.status().ToString();
  EXPECT_EQ(*common, 150u);
  // Another job's steps are not this one's.
  auto other = NewestCommonStep(store, 2, {"shard-0", "shard-1"});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(*other, 0u);
  // A rollback to 150 forgets shard-1's abandoned 200, on disk and in what
  // it publishes.
  shard1.RolledBack(150);
  EXPECT_EQ(HeldSteps(dir, "shard-1"), (std::vector<uint64_t>{150}));
  ASSERT_TRUE(shard1.Publish(store, 1).ok());
  published = store.Get({CheckpointKey(1, "shard-1")}, std::chrono::milliseconds(0));
  ASSERT_TRUE(published.ok());
  EXPECT_EQ(published->at(0), "150");
  // A restarted process's ledger knew no steps: rolled back, it offers the
  // older ones it still holds as well (another part's files of the step may
  // prove damaged, and the job then goes back to one of those).
  CheckpointLedger restarted(dir, "shard-0");
  restarted.RolledBack(150);
  ASSERT_TRUE(restarted.Publish(store, 1).ok());
  published = store.Get({CheckpointKey(1, "shard-0")}, std::chrono::milliseconds(0));
  ASSERT_TRUE(published.ok());
  EXPECT_EQ(published->at(0), "100,150");
  // Damaged files of 150 are set aside and no longer offered.
  ASSERT_TRUE(SetAsideDamagedPart(store, 1, dir, 150, "shard-0").ok());
  published = store.Get({CheckpointKey(1, "shard-0")}, std::chrono::milliseconds(0));
  ASSERT_TRUE(published.ok());
  EXPECT_EQ(published->at(0), "100");
  EXPECT_EQ(HeldSteps(dir, "shard-0"), (std::vector<uint64_t>{100}));
  EXPECT_TRUE(fs::exists(dir + "/step-150/shard-0.bin.damaged"));
  auto after = NewestCommonStep(store, 1, {"shard-0", "shard-1"});
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, 0u);
  // A new job offers nothing of the last one.
  shard1.Reset();
  ASSERT_TRUE(shard1.Publish(store, 2).ok());
  ASSERT_TRUE(shard0.Publish(store, 2).ok());
  auto next_job = NewestCommonStep(store, 2, {"shard-0", "shard-1"});
  ASSERT_TRUE(next_job.ok());
  EXPECT_EQ(*next_job, 0u);
  // A published list that is not one is refused, naming the part.
  for (const char* bad : {"12,x", "1,,2", "-5", "0", "99999999999999999999999", "100,"}) {
    ASSERT_TRUE(store.Set(CheckpointKey(1, "shard-1"), bad).ok());
    auto refused = NewestCommonStep(store, 1, {"shard-0", "shard-1"});
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("shard-1"), std::string::npos);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gridsync
