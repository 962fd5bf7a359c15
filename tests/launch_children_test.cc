// gridsync launch's children (tools/launch_children.h), started for real:
// what a child inherits from the launcher across exec.
#include "tools/launch_children.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "common/checkpoint_files.h"
#include "common/config.h"
#include "ops/service_watchdog.h"
#include "tools/launch_watchdog.h"

namespace gridsync::launch_detail {
namespace {

// Waits for the child's exit (at most 10 s); its wait status, or -1.
int WaitStatus(Child& child) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(child.pid, &status, WNOHANG) == child.pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(child.pid, SIGKILL);
  waitpid(child.pid, nullptr, 0);
  return -1;
}

// Spawns `script` under /bin/sh as gridsync launch starts a child, and
// returns its wait status (-1: still running after 10 s, then killed).
int RunChild(const std::string& script) {
  Child child = Spawn("probe", {"/bin/sh", "-c", script}, {}, false);
  if (child.pid <= 0) return -1;
  const int status = WaitStatus(child);
  Drain(child);
  close(child.fd);
  return status;
}

// A hostile probe: a coordinator stopped within its first third of the
// watchdog's timeout (before its first WATCHDOG=1) was never killed, since
// the launcher armed its watchdog on the first ping; the shards and workers
// spent their restarts on it and the job was lost. READY=1 arms it now, as
// systemd's watchdog counts from there; other states do not.
TEST(LaunchWatchdog, ReadyCountsAsAPingAsSystemdCountsFromIt) {
  auto socket = NotifySocket::Open("ready-test-" + std::to_string(getpid()));
  ASSERT_TRUE(socket.ok()) << socket.status().ToString();
  ASSERT_EQ(setenv("NOTIFY_SOCKET", (*socket)->address().c_str(), 1), 0);
  EXPECT_FALSE((*socket)->Pinged()) << "nothing was sent";
  NotifyStopping();  // STOPPING=1
  EXPECT_FALSE((*socket)->Pinged()) << "STOPPING=1 is no ping";
  NotifyReady("serving");  // READY=1\nSTATUS=serving
  EXPECT_TRUE((*socket)->Pinged()) << "READY=1 arms the watchdog";
  EXPECT_FALSE((*socket)->Pinged()) << "each datagram is read once";
  unsetenv("NOTIFY_SOCKET");
}

// A server's start may take ServerStartTimeout (90 s, or 3 x timeout_s):
// the launcher's default --start-timeout, and what a server asks systemd
// for at its start (EXTEND_TIMEOUT_USEC=), since the units' 90 s killed a
// shard still waiting in time with timeout_s over 45 s. The request reaches
// a real notify socket as systemd reads it, and the launcher's socket
// takes it for no ping.
TEST(LaunchWatchdog, ServersAskForTheStartTheirWaitsAllow) {
  EXPECT_EQ(ServerStartTimeout(5.0), std::chrono::milliseconds(90'000));
  EXPECT_EQ(ServerStartTimeout(30.0), std::chrono::milliseconds(90'000));
  EXPECT_EQ(ServerStartTimeout(50.0), std::chrono::milliseconds(150'000));
  EXPECT_EQ(LaunchStartTimeout(Config{}, 0), ServerStartTimeout(Config{}.distributed.timeout_s));
  EXPECT_EQ(LaunchStartTimeout(Config{}, 2.5), std::chrono::milliseconds(2500));

  const std::string name = "gridsync-start-test-" + std::to_string(getpid());
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // abstract: sun_path[0] = 0
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr),
                 static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())),
            0);
  ASSERT_EQ(setenv("NOTIFY_SOCKET", ("@" + name).c_str(), 1), 0);
  NotifyStartTimeout(ServerStartTimeout(50.0));
  char buffer[256] = {};
  const ssize_t n = recv(fd, buffer, sizeof(buffer) - 1, MSG_DONTWAIT);
  close(fd);
  ASSERT_GT(n, 0) << "nothing reached the notify socket";
  EXPECT_EQ(std::string(buffer, static_cast<size_t>(n)), "EXTEND_TIMEOUT_USEC=150000000");

  auto launcher = NotifySocket::Open("start-test-" + std::to_string(getpid()));
  ASSERT_TRUE(launcher.ok()) << launcher.status().ToString();
  ASSERT_EQ(setenv("NOTIFY_SOCKET", (*launcher)->address().c_str(), 1), 0);
  NotifyStartTimeout(ServerStartTimeout(50.0));
  EXPECT_FALSE((*launcher)->Pinged()) << "a start timeout is no sign that the server serves";
  unsetenv("NOTIFY_SOCKET");
}

// A closed terminal's SIGHUP can reach a child before its main blocks
// SIGHUP (the binaries' sigwait thread, ops/service_watchdog.h); it killed
// it. The child now starts with SIGHUP blocked, so a hangup that early
// waits, pending, for that thread. The shell sends itself the SIGHUP as its
// first act and must live to say so.
TEST(LaunchChildren, ChildStartsWithHangupBlocked) {
  const int status = RunChild("kill -HUP $$; echo alive");
  ASSERT_NE(status, -1) << "the child did not exit within 10 s";
  EXPECT_FALSE(WIFSIGNALED(status))
      << "killed by signal " << WTERMSIG(status) << " (SIGHUP is " << SIGHUP << ")";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << Describe(status);
}

// SIGTERM and SIGINT stay deliverable: the launcher stops its children
// with them, and only SIGHUP is held back.
TEST(LaunchChildren, TerminateStillEndsTheChild) {
  const int status = RunChild("kill -TERM $$; echo survived");
  ASSERT_NE(status, -1) << "the child did not exit within 10 s";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << Describe(status);
}

// A process the coordinator refused for good exits kCannotRejoinExitCode;
// the launcher does not restart it. Any other exit, or a signal, it does.
TEST(LaunchChildren, OnlyItsOwnExitCodeMeansCannotRejoin) {
  const int refused = RunChild("exit " + std::to_string(kCannotRejoinExitCode));
  Child child;
  child.exited = true;
  child.status = refused;
  EXPECT_TRUE(CannotRejoin(child)) << Describe(refused);
  child.status = RunChild("exit 1");
  EXPECT_FALSE(CannotRejoin(child)) << Describe(child.status);
  child.status = RunChild("kill -KILL $$");
  EXPECT_FALSE(CannotRejoin(child)) << Describe(child.status);
}

// A process that refused another run's checkpoint files exits
// kCheckpointsHeldExitCode (shards and workers alike); not restarted either.
TEST(LaunchChildren, OnlyItsOwnExitCodeMeansRefusedCheckpoints) {
  Child child;
  child.exited = true;
  child.status = RunChild("exit " + std::to_string(kCheckpointsHeldExitCode));
  EXPECT_TRUE(RefusedCheckpoints(child)) << Describe(child.status);
  EXPECT_FALSE(CannotRejoin(child)) << Describe(child.status);
  for (const char* other : {"exit 1", "exit 5", "kill -KILL $$"}) {
    child.status = RunChild(other);
    EXPECT_FALSE(RefusedCheckpoints(child)) << other << ": " << Describe(child.status);
  }
}

// The restart line names what the restarted process will do: with every
// part on this machine, the step it rejoins from, or that there is none.
TEST(LaunchChildren, RestartPlanNamesTheStepOrItsAbsence) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("launch-plan-" + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::vector<std::string> parts = {"shard-0", "shard-1"};
  EXPECT_NE(RestartPlan(false, true, dir.string(), parts).find("no complete checkpoint yet"),
            std::string::npos);
  // One part's step 50 alone is not complete; both parts' is.
  ASSERT_TRUE(WriteCheckpointPart(dir.string(), 50, "shard-0", "abc", {{"rows", 1}}).ok());
  EXPECT_NE(RestartPlan(false, true, dir.string(), parts).find("no complete checkpoint yet"),
            std::string::npos);
  ASSERT_TRUE(WriteCheckpointPart(dir.string(), 50, "shard-1", "def", {{"rows", 1}}).ok());
  EXPECT_NE(RestartPlan(false, true, dir.string(), parts).find("step 50"), std::string::npos)
      << RestartPlan(false, true, dir.string(), parts);
  // The launcher of one node sees its own parts only: no step named.
  EXPECT_EQ(RestartPlan(false, false, dir.string(), parts).find("step 50"), std::string::npos);
  EXPECT_NE(RestartPlan(true, true, dir.string(), parts).find("the job it kept"),
            std::string::npos);
  fs::remove_all(dir);
}

// --max-restarts backs off: the first restart at once, then 0.5 s, doubling,
// at most half of timeout_s (the others' wait for a rejoin).
TEST(LaunchChildren, TheDelayBeforeEachRestartDoublesFromHalfASecondUpToHalfTheTimeout) {
  const std::chrono::milliseconds timeout(10000);
  EXPECT_EQ(RestartDelay(1, timeout), std::chrono::milliseconds(0));
  EXPECT_EQ(RestartDelay(2, timeout), std::chrono::milliseconds(500));
  EXPECT_EQ(RestartDelay(3, timeout), std::chrono::milliseconds(1000));
  EXPECT_EQ(RestartDelay(4, timeout), std::chrono::milliseconds(2000));
  EXPECT_EQ(RestartDelay(5, timeout), std::chrono::milliseconds(4000));
  EXPECT_EQ(RestartDelay(6, timeout), std::chrono::milliseconds(5000));
  EXPECT_EQ(RestartDelay(1000, timeout), std::chrono::milliseconds(5000));
  EXPECT_EQ(RestartDelay(3, std::chrono::milliseconds(1000)), std::chrono::milliseconds(500));
}

// Beside a failure, the launcher names the others whose pings are late:
// armed, running, silent past half their watchdog timeout; not one that is
// still starting, one that exited, one without a watchdog, nor the failed
// process itself.
TEST(LaunchWatchdog, LateToPingNamesOnlyTheRunningArmedAndSilent) {
  const auto now = std::chrono::steady_clock::now();
  auto make = [&](const std::string& name, bool armed, double silent_s) {
    Child c;
    c.name = name;
    c.pid = 4000 + static_cast<int>(name.size());
    auto socket = NotifySocket::Open(name);
    EXPECT_TRUE(socket.ok()) << socket.status().ToString();
    if (socket.ok()) c.notify = std::move(socket).value();
    c.armed = armed;
    c.watchdog = std::chrono::milliseconds(6000);
    c.pinged = now - std::chrono::milliseconds(static_cast<int64_t>(silent_s * 1000));
    return c;
  };
  std::vector<Child> children;
  children.push_back(make("coordinator", true, 4.0));  // late: 4 s > 3 s
  children.push_back(make("ps-0", true, 2.5));         // on time
  children.push_back(make("ps-1", false, 50.0));       // starting: the start timeout's
  children.push_back(make("worker-0", true, 9.0));     // the failed one
  children.push_back(make("worker-1", true, 8.0));     // exited
  children.back().exited = true;
  children.push_back(make("worker-2", true, 8.0));  // no watchdog
  children.back().notify.reset();
  const auto late = LateToPing(children, &children[3], now);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0],
            "coordinator (pid 4011) has sent no watchdog ping for 4.0 s (one is due every 2.0 s)");
  EXPECT_TRUE(LateToPing(children, &children[0], now).size() == 1u &&
              LateToPing(children, &children[0], now)[0].rfind("worker-0 ", 0) == 0)
      << "the failed process is left out, and only it";
}

}  // namespace
}  // namespace gridsync::launch_detail
