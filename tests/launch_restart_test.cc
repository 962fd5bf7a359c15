// gridsync launch --max-restarts against a process that fails at every
// start: the restarts back off (RestartDelay: the first at once, then
// 0.5 s, doubling, at most half of timeout_s). Before, every restart came
// at once, and a crash loop spent them within milliseconds. Runs the real
// binaries; the failing process is a real shard whose port another socket
// holds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "tests/binary_runner.h"
#include "tests/loopback_listener.h"

namespace {

using binary_runner::Execute;
using binary_runner::ProcessResult;
using std::chrono::milliseconds;

TEST(LaunchRestartTest, AShardFailingAtEveryStartIsRestartedWithBackoffThenStops) {
  uint16_t shard_port = 0;
  const int holder = gridsync::testing::ListenOnLoopback(&shard_port);
  ASSERT_GE(holder, 0);
  const std::string dir = ::testing::TempDir() + "/launch-restart-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  // Shard 0 listens on master_port + 1: the port the socket above holds.
  const auto start = std::chrono::steady_clock::now();
  const ProcessResult run = Execute(
      "tools/gridsync",
      "launch configs/local.json --set distributed.gradient_sync=ps --set "
      "distributed.master_port=" +
          std::to_string(shard_port - 1) +
          " --set distributed.timeout_s=4 --set training.steps=20 --set checkpoint.every_steps=10 "
          "--set checkpoint.dir=" +
          dir + "/ck --set task.output=" + dir + "/out --max-restarts 3");
  const auto took = std::chrono::steady_clock::now() - start;
  ::close(holder);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("Address already in use"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("restarting it (1 of 3): "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("restarting it (2 of 3) in 0.5 s: "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("restarting it (3 of 3) in 1.0 s: "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("no restarts left (--max-restarts)"), std::string::npos) << run.output;
  EXPECT_GE(took, milliseconds(1500)) << "the restarts did not wait";
}

}  // namespace
