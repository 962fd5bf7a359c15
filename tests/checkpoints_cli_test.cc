// `gridsync checkpoints`: what checkpoint.dir holds for this machine's
// parts, and the step gridsync launch --resume would start from, without
// changing anything. Checked against a real run's files, damaged, forged
// under CURVE and of another run, and against the launcher's own choice.
// Runs the real binaries (cli_test.cc: the rest of the contract).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/checkpoint_files.h"
#include "common/config.h"
#include "common/sharding.h"
#include "common/wire/curve.h"
#include "spec/run_spec.h"
#include "spec/shard_memory.h"
#include "tests/binary_runner.h"
#include "tests/checkpoint_forgery.h"
#include "tests/curve_test_keys.h"

namespace {

namespace fs = std::filesystem;
using binary_runner::Execute;
using binary_runner::ProcessResult;

bool Has(const ProcessResult& run, const std::string& words) {
  return run.output.find(words) != std::string::npos;
}

// One byte of `path` changed.
void Damage(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(10);
  f.put('\x5a');
}

class CheckpointsCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/checkpoints-cli-" + std::to_string(::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The config's keys of every run here: local.json (two shards, ps), its
  // hash tables smaller (kModel: the parts written by hand match them).
  static constexpr const char* kModel = "encoding.log2_hashmap_size=14";
  std::string Sets(int steps) const {
    return std::string(" --set ") + kModel +
           " --set distributed.gradient_sync=ps --set distributed.master_port=28800 --set "
           "checkpoint.every_steps=50 --set training.steps=" +
           std::to_string(steps) + " --set checkpoint.dir=" + ckpt() +
           " --set task.output=" + dir_ + "/out";
  }
  ProcessResult Inspect(int steps, const std::string& more = "") const {
    return Execute("tools/gridsync", "checkpoints configs/local.json" + Sets(steps) + more);
  }
  std::string ckpt() const { return dir_ + "/ck"; }
  std::string Bin(uint64_t step, const std::string& part) const {
    return ckpt() + "/step-" + std::to_string(step) + "/" + part + ".bin";
  }

  // Writes shard part `part` of `step` as that config's shard would (the
  // shape and size spec/shard_memory.h gives, zeros for values), naming
  // `run`: the launcher checks parts against the config before anything
  // starts, so the cases below turn on their runs alone.
  void WriteShardPart(uint64_t step, const std::string& part, const std::string& run,
                      const gridsync::CheckpointMacKey* key = nullptr) const {
    auto config =
        gridsync::Config::LoadFile("configs/local.json", {kModel, "distributed.gradient_sync=ps"});
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    auto spec = gridsync::RunSpec::Resolve(*config);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto partition = gridsync::Partition::Make(
        spec->model.tables, static_cast<uint32_t>(config->ps.shards), spec->sync.partition_dim);
    ASSERT_TRUE(partition.ok()) << partition.status().ToString();
    const auto shard = static_cast<uint32_t>(std::stoul(part.substr(6)));
    const std::string data(gridsync::ShardStateBytes(*spec, *partition, shard), '\0');
    ASSERT_TRUE(gridsync::WriteCheckpointPart(ckpt(), step, part, data,
                                              gridsync::ShardCheckpointShape(*partition, shard), {},
                                              run, key)
                    .ok());
  }

  std::string dir_;
};

TEST_F(CheckpointsCliTest, NamesEachStepsStateAndTheLaunchersChoiceAndMovesNothing) {
  const ProcessResult trained = Execute("tools/gridsync", "launch configs/local.json" + Sets(150));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  // Every step trained: the launcher's refusal, and its exit code.
  ProcessResult run = Inspect(150);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_TRUE(Has(run, "step 150: intact")) << run.output;
  EXPECT_TRUE(Has(run, "nothing is left to train")) << run.output;
  run = Inspect(300);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Has(run, "parts on this machine: shard-0, shard-1")) << run.output;
  EXPECT_TRUE(Has(run, "step 150: intact, run ")) << run.output;
  EXPECT_TRUE(
      Has(run, "gridsync launch: would resume from the checkpoint of step 150 in " + ckpt()))
      << run.output;
  // Another model (a smaller hash table) or optimizer placement than the
  // run's: refused before anything starts, naming the part, what its shard
  // would hold now and the change (each shard refused it at its start, and
  // the launcher ended 1; a hostile probe).
  run = Inspect(300, " --set encoding.log2_hashmap_size=13");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_TRUE(Has(run, "step-150/shard-0.json: shape [[")) << run.output;
  EXPECT_TRUE(Has(run, "this config's shard 0 holds [[")) << run.output;
  EXPECT_TRUE(Has(run, "changed since the run started: encoding.log2_hashmap_size")) << run.output;
  // A damaged .bin: named, passed over, and left where it is.
  Damage(Bin(150, "shard-1"));
  run = Inspect(300);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Has(run, "step 150:\n  shard-0: intact, run ")) << run.output;
  EXPECT_TRUE(Has(run, "(would be set aside as shard-1.bin.damaged); passed over")) << run.output;
  EXPECT_TRUE(Has(run, "shard-1: damaged: " + Bin(150, "shard-1") + ": checksum")) << run.output;
  EXPECT_TRUE(Has(run, "shard-0: intact")) << run.output;
  EXPECT_TRUE(Has(run, "would resume from the older complete step 100 instead")) << run.output;
  for (const char* ext : {".bin", ".json"}) {
    const std::string file = ckpt() + "/step-150/shard-1" + ext;
    EXPECT_TRUE(fs::exists(file)) << file;
    EXPECT_FALSE(fs::exists(file + ".damaged")) << file;
  }
  // The launcher takes the step the inspector named.
  const ProcessResult resumed =
      Execute("tools/gridsync", "launch configs/local.json --resume" + Sets(200));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(Has(resumed, "resuming from the older complete step 100")) << resumed.output;
  // Nothing intact: the launcher's exit 3.
  for (uint64_t step : gridsync::HeldSteps(ckpt(), "shard-0")) Damage(Bin(step, "shard-0"));
  run = Inspect(300);
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_TRUE(Has(run, "gridsync launch --resume would refuse (exit 3)")) << run.output;
  // A node of no layout is refused as by launch.
  run = Inspect(300, " --node nowhere");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_TRUE(Has(run, "--node nowhere: no such node in configs/local.json; allowed: node0"))
      << run.output;
}

// Under CURVE a step forged from an older one (its files copied, the
// manifest's step edited) is named by its MAC; without the keys nothing can
// tell it apart (the stated limit), and the inspector says what the
// launcher would do in each case.
TEST_F(CheckpointsCliTest, AForgedStepIsNamedByItsMacUnderCurve) {
  const std::string keys = dir_ + "/keys";
  ASSERT_NO_FATAL_FAILURE(gridsync::testing::WriteTestKeys(keys));
  gridsync::Config config;
  config.security.curve = true;
  config.security.keys_dir = keys;
  auto key = gridsync::wire::CheckpointMacKeyFor(config, "shard");
  ASSERT_TRUE(key.ok() && key->has_value()) << key.status().ToString();
  const std::string run_id = "0123456789abcdef0123456789abcdef";
  for (const char* part : {"shard-0", "shard-1"}) {
    WriteShardPart(100, part, run_id, &**key);
    gridsync::testing::ForgeStep(ckpt(), part, 100, 150);
  }
  const std::string curve = " --set security.mode=curve --set security.keys_dir=" + keys;
  ProcessResult run = Inspect(300, curve);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Has(run, "shard-0: damaged: " + ckpt() +
                           "/step-150/shard-0.json: its mac does "
                           "not match"))
      << run.output;
  EXPECT_TRUE(Has(run, "step 100: intact, run 0123456789ab (every part)")) << run.output;
  EXPECT_TRUE(Has(run, "would resume from the older complete step 100 instead")) << run.output;
  // A key that fails to load is named once, by this command (the dry run
  // of the launcher's choice loads the keys again, silently).
  std::ofstream(keys + "/worker.key") << "garbage";
  run = Inspect(300, curve);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  const std::string warned = "the worker checkpoints' MACs are not checked here";
  EXPECT_TRUE(Has(run, "gridsync checkpoints: " + warned)) << run.output;
  EXPECT_EQ(run.output.find(warned), run.output.rfind(warned)) << run.output;
  EXPECT_TRUE(Has(run, "would resume from the older complete step 100 instead")) << run.output;
  run = Inspect(300, " --set security.mode=off");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Has(run, "would resume from the checkpoint of step 150")) << run.output;
}

// The folder's run (coordinator-state.json) against the files': a step of
// another run is passed over, naming both runs; and what the folder holds
// is described when none of its steps is this machine's, its file names
// escaped (a name that could drive the operator's terminal).
TEST_F(CheckpointsCliTest, AnotherRunsStepIsPassedOverAndFileNamesAreEscaped) {
  const std::string mine = "0123456789abcdef0123456789abcdef";
  const std::string other = "fedcba9876543210fedcba9876543210";
  for (const char* part : {"shard-0", "shard-1"}) {
    WriteShardPart(100, part, mine);
    WriteShardPart(150, part, other);
  }
  std::ofstream(ckpt() + "/coordinator-state.json")
      << R"({"format": "gridsync-coordinator-state", "version": 1, "job": 1, "epoch": 0,
             "expected_shards": 2, "expected_workers": 2, "job_done": false,
             "training_started": true, "resume_step": 0, "run": ")"
      << mine << R"(", "checkpoints": {}})";
  ProcessResult run = Inspect(300);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Has(run, "the folder's run " + mine)) << run.output;
  EXPECT_TRUE(Has(run,
                  "shard-0: intact, of another run (fedcba987654, the folder's is "
                  "0123456789ab)"))
      << run.output;
  EXPECT_TRUE(Has(run, "its files belong to run")) << run.output;
  EXPECT_TRUE(Has(run, "would resume from the older complete step 100 instead")) << run.output;
  // A folder whose steps hold none of this machine's parts.
  fs::remove_all(ckpt());
  fs::create_directories(ckpt() + "/step-7");
  std::ofstream(ckpt() + "/step-7/\x1b]0;owned\x07.json") << "{}";
  run = Inspect(300);
  EXPECT_EQ(run.exit_code, 2) << run.output;  // no complete step: as the launcher
  EXPECT_TRUE(Has(run, ckpt() + " holds step 7 (")) << run.output;
  EXPECT_TRUE(Has(run, "\\x1b]0;owned\\x07")) << run.output;
  EXPECT_FALSE(Has(run, "\x1b")) << run.output;
  // The launcher's refusal describes the folder the same way.
  run = Execute("tools/gridsync", "launch configs/local.json --resume" + Sets(300));
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_TRUE(Has(run, "\\x1b]0;owned\\x07")) << run.output;
  EXPECT_FALSE(Has(run, "\x1b")) << run.output;
}

// The cases where the launcher's choice turns on more than damage: a step
// whose parts name different runs is refused (exit 3), not passed over; a
// part that names no run is another run's where the folder names one; a
// file the checks cannot read (not damage) leaves the step to its part,
// which names it at its start.
TEST_F(CheckpointsCliTest, MixedRunsUnnamedRunsAndUnreadableFilesAreJudgedAsTheLauncherDoes) {
  const std::string mine = "0123456789abcdef0123456789abcdef";
  const std::string other = "fedcba9876543210fedcba9876543210";
  const auto write = [&](uint64_t step, const char* part, const std::string& run) {
    WriteShardPart(step, part, run);
  };
  write(100, "shard-0", mine);
  write(100, "shard-1", mine);
  write(150, "shard-0", mine);
  write(150, "shard-1", other);
  ProcessResult run = Inspect(300);
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_TRUE(Has(run, "gridsync launch --resume would refuse (exit 3)")) << run.output;
  EXPECT_TRUE(Has(run,
                  "step 150:\n  shard-0: intact, run 0123456789ab\n  shard-1: intact, run "
                  "fedcba987654"))
      << run.output;
  // Step 150 without a run, where the folder names one.
  write(150, "shard-0", "");
  write(150, "shard-1", "");
  std::ofstream(ckpt() + "/coordinator-state.json")
      << R"({"format": "gridsync-coordinator-state", "version": 1, "job": 1, "epoch": 0,
             "expected_shards": 2, "expected_workers": 2, "job_done": false,
             "training_started": true, "resume_step": 0, "run": ")"
      << mine << R"(", "checkpoints": {}})";
  run = Inspect(300);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Has(run, "shard-0: intact, of another run (unnamed, the folder's is 0123456789ab)"))
      << run.output;
  EXPECT_TRUE(Has(run, "would resume from the older complete step 100 instead")) << run.output;
  // A folder where step 150's .bin was: damage, passed over as a bad
  // checksum is (it kept the step, and the shard failed at its start).
  write(150, "shard-0", mine);
  write(150, "shard-1", mine);
  fs::remove(Bin(150, "shard-1"));
  fs::create_directories(Bin(150, "shard-1"));
  run = Inspect(300);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Has(run, "  shard-1: damaged: " + Bin(150, "shard-1") +
                           " is a folder, where gridsync writes a file"))
      << run.output;
  EXPECT_TRUE(Has(run, "would resume from the older complete step 100 instead")) << run.output;
  // With --node: what this machine offers the other launchers (FindLocalSteps).
  run = Inspect(300, " --node node0");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Has(run, "this machine offers steps 100 (")) << run.output;
}

}  // namespace
