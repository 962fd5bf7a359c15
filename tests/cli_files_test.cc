// The binaries' contract with operators about the files and folders a run
// writes or reads: task.output, checkpoint folders, keys. What check-config
// refuses, every binary refuses alike, and a check makes nothing. Runs the
// real binaries (cli_test.cc: the rest of the contract).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/binary_runner.h"

namespace {

using binary_runner::Execute;
using binary_runner::ExpectRefused;
using binary_runner::ProcessResult;

// Issue: an unwritable task.output failed only after the whole run.
TEST(CliTest, UnwritableOutputIsRefusedBeforeTraining) {
  const ProcessResult run =
      Execute("worker/gridsync-worker",
              "--config configs/local.json --standalone --set training.steps=10000000 "
              "--set task.output=/proc/gridsync-cannot-write-here");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("task.output"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("/proc/gridsync-cannot-write-here"), std::string::npos) << run.output;
  // A folder where the reconstruction goes.
  const std::string out = ::testing::TempDir() + "/gridsync-out-" + std::to_string(::getpid());
  std::filesystem::create_directories(out + "/reconstruction.png");
  ExpectRefused("worker/gridsync-worker",
                "--config configs/local.json --standalone --set task.output=" + out,
                "task.output: '" + out +
                    "/reconstruction.png' is a folder, where the run writes its reconstruction");
  std::filesystem::remove_all(out);
  // --dump-params too (a probe trained 60000 steps before it was refused).
  ExpectRefused("worker/gridsync-worker",
                "--config configs/local.json --standalone --set training.steps=10000000 "
                "--dump-params /proc/gridsync-no-folder/params.bin",
                "--dump-params /proc/gridsync-no-folder/params.bin: cannot create folder");
  ExpectRefused("worker/gridsync-worker",
                "--config configs/local.json --standalone --set training.steps=10000000 "
                "--dump-params configs",
                "--dump-params configs: is a folder");
  // Three a hostile probe saw pass --check-only (which gridsync launch runs
  // before it starts anything): rank 1's --dump-params wrote nothing and said
  // nothing, --timeline at a folder failed the start, and --start-step
  // without checkpoints failed on an indirect "pull for version" error.
  ExpectRefused("worker/gridsync-worker",
                "--config configs/local.json --rank 1 --dump-params out/p.bin --check-only",
                "--dump-params out/p.bin: rank 1 holds no final model to write");
  ExpectRefused("worker/gridsync-worker",
                "--config configs/local.json --standalone --timeline configs --check-only",
                "--timeline configs: is a folder");
  ExpectRefused("worker/gridsync-worker",
                "--config configs/local.json --rank 0 --start-step 5 --check-only",
                "--start-step 5: checkpoint.every_steps is 0");
}

// A hostile probe: check-config said OK to CURVE without its keys and to a
// checkpoint folder nobody can create, and the processes then exited 2 or
// 1. Both are refused by check-config now, naming the file or folder.
TEST(CliTest, CheckConfigRefusesMissingKeysAndAnUnwritableCheckpointFolder) {
  ExpectRefused("tools/gridsync",
                "check-config configs/local.json --set security.mode=curve --set "
                "security.keys_dir=/nonexistent-gridsync-keys",
                "cannot read key file /nonexistent-gridsync-keys/coordinator.key");
  ExpectRefused("tools/gridsync",
                "check-config configs/local.json --set checkpoint.every_steps=2 --set "
                "checkpoint.dir=/proc/gridsync-cannot-write-here",
                "checkpoint.dir: cannot create folder '/proc/gridsync-cannot-write-here'");
}

// A hostile probe: check-config refused a checkpoint.dir that is a file, but
// gridsync-ps served the job with every checkpoint failing; the shard also
// took any --log-level (silencing even its fatal error) and a config with
// distributed.enable false. Each binary refuses them at its start now.
TEST(CliTest, EveryBinaryRefusesTheCheckpointFolderCheckConfigRefuses) {
  const std::string sets =
      " --set checkpoint.every_steps=2 --set checkpoint.dir=configs/local.json";
  const std::string words = "checkpoint.dir: cannot create folder 'configs/local.json'";
  ExpectRefused("tools/gridsync", "check-config configs/local.json" + sets, words);
  ExpectRefused("server/gridsync-ps", "--config configs/local.json --shard 0" + sets, words);
  ExpectRefused("server/gridsync-coordinator", "--config configs/local.json" + sets, words);
  ExpectRefused("worker/gridsync-worker", "--config configs/local.json --rank 0" + sets, words);
  // The same port twice: the metrics bind failed with exit 1 once serving.
  ExpectRefused("server/gridsync-coordinator",
                "--config configs/local.json --port 28791 --metrics-port 28791",
                "metrics port 28791 (--metrics-port) is the coordinator's port (--port)");
  ExpectRefused("server/gridsync-ps",
                "--config configs/local.json --shard 0 --set distributed.enable=false --set "
                "distributed.world_size=1",
                "distributed.enable is false: one process trains alone and no PS shard runs");
  ExpectRefused("server/gridsync-ps", "--config configs/local.json --shard 0 --log-level bogus",
                "bogus");
}

// A secret key readable by others: check-config refused it, but launch
// started everything and the worker failed with exit 1 after loading its
// image (a hostile probe). All three refuse it now, exit 2, same words.
TEST(CliTest, ASecretKeyReadableByOthersIsRefusedAlike) {
  const std::string dir = ::testing::TempDir() + "/loose-keys-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const ProcessResult made = Execute("tools/gridsync", "keygen " + dir);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ASSERT_EQ(::chmod((dir + "/worker.key").c_str(), 0644), 0);
  const std::string sets = " --set security.mode=curve --set security.keys_dir=" + dir +
                           " --set distributed.master_port=28770";
  const std::string words =
      dir + "/worker.key: the secret key is readable by others (mode 0644); allowed: 0600";
  ExpectRefused("tools/gridsync", "check-config configs/local.json" + sets, words);
  const ProcessResult launch = Execute("tools/gridsync", "launch configs/local.json" + sets);
  EXPECT_EQ(launch.exit_code, 2) << launch.output;
  EXPECT_NE(launch.output.find(words), std::string::npos) << launch.output;
  EXPECT_EQ(launch.output.find("starting"), std::string::npos)
      << "launch started processes: " << launch.output;
  const ProcessResult worker =
      Execute("worker/gridsync-worker", "--config configs/local.json --rank 1" + sets);
  EXPECT_EQ(worker.exit_code, 2) << worker.output;
  EXPECT_NE(worker.output.find(words), std::string::npos) << worker.output;
  EXPECT_EQ(worker.output.find("fitting"), std::string::npos)
      << "the worker loaded its image first: " << worker.output;
  std::filesystem::remove_all(dir);
}

// Checks leave nothing behind: check-config and --check-only made
// task.output and checkpoint.dir with their parents, so a typo left a tree
// of folders (a hostile probe). A folder that cannot be made is refused
// alike, naming the parent in the way.
TEST(CliTest, ChecksMakeNoFolders) {
  const std::string root = ::testing::TempDir() + "/no-folders-" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const std::string sets = " --set task.output=" + root + "/out/a/b" +
                           " --set checkpoint.every_steps=10 --set checkpoint.dir=" + root +
                           "/ck/c --set distributed.master_port=28790";
  const ProcessResult checked = Execute("tools/gridsync", "check-config configs/local.json" + sets);
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  const ProcessResult worker =
      Execute("worker/gridsync-worker", "--config configs/local.json --rank 0 --check-only" + sets);
  EXPECT_EQ(worker.exit_code, 0) << worker.output;
  EXPECT_TRUE(std::filesystem::is_empty(root)) << "a check made folders under " << root;
  std::ofstream(root + "/file") << "a file where a folder goes\n";
  const std::string blocked = " --set task.output=" + root + "/file/out";
  const std::string words =
      "cannot create folder '" + root + "/file/out': '" + root + "/file' is not a folder";
  ExpectRefused("tools/gridsync", "check-config configs/local.json" + blocked, words);
  ExpectRefused("worker/gridsync-worker",
                "--config configs/local.json --rank 0 --check-only" + blocked, words);
  ExpectRefused("tools/gridsync", "check-config configs/local.json --set task.output=/proc/x/y",
                "cannot create folder '/proc/x/y'");
  std::filesystem::remove_all(root);
}

// A symbolic link to nothing where a folder goes (task.output,
// checkpoint.dir, or a parent of either that does not exist): check-config
// and --check-only passed it, and every process refused it at its start
// with "File exists" (a hostile probe). All refuse it alike now, naming the
// link and its target. A --dump-params link to nothing is the write's to
// replace: its check made the link's target (a stray empty file, once at
// /nonexistent) and removed the link.
TEST(CliTest, ALinkToNothingIsRefusedAlikeAndChecksFollowNoLink) {
  namespace fs = std::filesystem;
  const std::string root =
      ::testing::TempDir() + "/gridsync-dangling-" + std::to_string(::getpid());
  fs::remove_all(root);
  fs::create_directories(root);
  fs::create_symlink(root + "/missing", root + "/dl");
  for (const std::string& folder : {root + "/dl", root + "/dl/sub"}) {
    const std::string words =
        "'" + root + "/dl' is a symbolic link to '" + root + "/missing', which does not exist";
    const std::string output = " --set distributed.master_port=28792 --set task.output=" + folder;
    ExpectRefused("tools/gridsync", "check-config configs/local.json" + output, words);
    ExpectRefused("worker/gridsync-worker",
                  "--config configs/local.json --rank 0 --check-only" + output, words);
    ExpectRefused("worker/gridsync-worker",
                  "--config configs/local.json --standalone --set training.steps=2" + output,
                  words);
    const std::string ck =
        " --set distributed.master_port=28792 --set checkpoint.every_steps=10 "
        "--set checkpoint.dir=" +
        folder;
    ExpectRefused("tools/gridsync", "check-config configs/local.json" + ck, words);
    ExpectRefused("server/gridsync-coordinator", "--config configs/local.json" + ck, words);
    ExpectRefused("server/gridsync-ps", "--config configs/local.json --shard 0" + ck, words);
  }
  EXPECT_FALSE(fs::exists(root + "/missing"));
  fs::create_symlink(root + "/params-target", root + "/params-link");
  const ProcessResult checked = Execute("worker/gridsync-worker",
                                        "--config configs/local.json --standalone --check-only "
                                        "--dump-params " +
                                            root + "/params-link");
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  EXPECT_FALSE(fs::exists(root + "/params-target")) << "the check made the link's target";
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(root + "/params-link")))
      << "the check removed the link";
  fs::remove_all(root);
}

// Under nccl no shard runs and no process reads shard.pub: a damaged one
// was refused by check-config and the coordinator while the workers started
// (a hostile probe). Under ps every process that reads it refuses it.
TEST(CliTest, AShardKeyNoProcessReadsIsNotRefused) {
  const std::string dir = ::testing::TempDir() + "/nccl-keys-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const ProcessResult made = Execute("tools/gridsync", "keygen " + dir);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  std::ofstream(dir + "/shard.pub", std::ios::trunc) << "not a key\n";
  const std::string sets = " --set security.mode=curve --set security.keys_dir=" + dir +
                           " --set distributed.master_port=28780";
  const std::string nccl = sets + " --set distributed.gradient_sync=nccl";
  const ProcessResult checked = Execute("tools/gridsync", "check-config configs/local.json" + nccl);
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  const ProcessResult worker =
      Execute("worker/gridsync-worker", "--config configs/local.json --rank 0 --check-only" + nccl);
  EXPECT_EQ(worker.exit_code, 0) << worker.output;
  ExpectRefused("tools/gridsync",
                "check-config configs/local.json" + sets + " --set distributed.gradient_sync=ps",
                dir + "/shard.pub: not a public key");
  ExpectRefused("worker/gridsync-worker",
                "--config configs/local.json --rank 0 --check-only" + sets +
                    " --set distributed.gradient_sync=ps",
                dir + "/shard.pub: not a public key");
  std::filesystem::remove_all(dir);
}

}  // namespace
