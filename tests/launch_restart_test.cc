// gridsync launch --max-restarts against a process that fails at every
// start: the restarts back off (RestartDelay: the first at once, then
// 0.5 s, doubling, at most half of timeout_s). Before, every restart came
// at once, and a crash loop spent them within milliseconds. Runs the real
// binaries; the failing process is a real shard whose port another socket
// holds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

// A coordinator frozen before READY=1 (a real one, behind a script that
// stops itself before it execs the binary, on its first start only) is
// killed once --start-timeout runs out and restarted, and the job ends 0.
// Before, the watchdog was armed only by READY=1, so such a process was
// never killed: the shards and workers spent their restarts against it.
TEST(LaunchRestartTest, AProcessFrozenBeforeReadyIsKilledAtTheStartTimeoutAndRestarted) {
  namespace fs = std::filesystem;
  const char* build = std::getenv("GRIDSYNC_BUILD_DIR");
  const fs::path built = fs::absolute(build ? build : "build");
  const std::string dir = ::testing::TempDir() + "/launch-frozen-" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir + "/bin");
  fs::create_symlink(built / "server" / "gridsync-ps", dir + "/bin/gridsync-ps");
  fs::create_symlink(built / "worker" / "gridsync-worker", dir + "/bin/gridsync-worker");
  {
    std::ofstream script(dir + "/bin/gridsync-coordinator");
    script << "#!/bin/sh\n"
           << "if [ ! -e '" << dir << "/frozen-once' ]; then : > '" << dir
           << "/frozen-once'; kill -STOP $$; fi\n"
           << "exec '" << (built / "server" / "gridsync-coordinator").string() << "' \"$@\"\n";
  }
  fs::permissions(dir + "/bin/gridsync-coordinator", fs::perms::owner_all);
  uint16_t port = 0;
  const int holder = gridsync::testing::ListenOnLoopback(&port);  // a free port, then let go
  ASSERT_GE(holder, 0);
  ::close(holder);
  const auto start = std::chrono::steady_clock::now();
  const ProcessResult run =
      Execute("tools/gridsync",
              "launch configs/local.json --bin-dir " + dir +
                  "/bin --set distributed.gradient_sync=ps --set distributed.master_port=" +
                  std::to_string(port) +
                  " --set distributed.timeout_s=10 --set training.steps=20 --set "
                  "checkpoint.every_steps=10 --set checkpoint.dir=" +
                  dir + "/ck --set task.output=" + dir + "/out --max-restarts 2 --start-timeout 2");
  const auto took = std::chrono::steady_clock::now() - start;
  const bool stopped_once = fs::exists(dir + "/frozen-once");
  fs::remove_all(dir);
  EXPECT_TRUE(stopped_once) << "the script never ran: " << run.output;
  EXPECT_EQ(run.exit_code, 0) << run.output;
  const size_t killed = run.output.find(
      "did not say it serves within 2 s of its start (no READY=1 or watchdog ping; "
      "--start-timeout): stuck or frozen while starting; killing it");
  ASSERT_NE(killed, std::string::npos) << run.output;
  const size_t line = run.output.rfind('\n', killed);
  EXPECT_NE(run.output.substr(line + 1, killed - line).find("gridsync launch: coordinator (pid "),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("restarting it (1 of 2)"), std::string::npos) << run.output;
  EXPECT_GE(took, milliseconds(2000)) << "killed before its start timeout";
}

}  // namespace
