// gridsync-coordinator as a child process: its exit codes, serving a client
// until SIGTERM, and systemd's readiness and watchdog over a real notify
// socket.
#include <atomic>

#include "common/config.h"
#include "spec/cluster_settings.h"
#include "spec/run_spec.h"
#include "tests/coordinator_test_util.h"

namespace gridsync {
namespace {

// ---- The real binary ----

std::string CoordinatorBinary() {
  const char* dir = std::getenv("GRIDSYNC_BUILD_DIR");
  return std::string(dir && *dir ? dir : "build") + "/server/gridsync-coordinator";
}

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "coordinator_test.XXXXXX").string();
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& text) const {
    std::string file = path_ + "/" + name;
    std::ofstream(file) << text;
    return file;
  }

 private:
  std::string path_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A child process that is killed and reaped when this object goes, and
// killed by the kernel if the test process dies first (PR_SET_PDEATHSIG).
class Child {
 public:
  Child(const std::vector<std::string>& args, const std::string& log_path) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls until exec.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      if (log_fd >= 0) {
        ::dup2(log_fd, STDOUT_FILENO);
        ::dup2(log_fd, STDERR_FILENO);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    if (log_fd >= 0) ::close(log_fd);
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  void Signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // The exit code (128 + signal when killed), or nullopt if still running.
  std::optional<int> WaitExit(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (pid_ > 0) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
        return -1;
      }
      if (Clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(10ms);
    }
    return std::nullopt;
  }

 private:
  pid_t pid_ = -1;
};

class CoordinatorBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(CoordinatorBinary()))
        << CoordinatorBinary() << " not found; set GRIDSYNC_BUILD_DIR to the build folder";
    ASSERT_FALSE(dir_.path().empty());
  }
  TempDir dir_;
};

TEST_F(CoordinatorBinaryTest, ExitsTwoOnABadConfig) {
  const std::string config = dir_.Write("bad.json", R"({"distributed": {"master_port": 70000}})");
  const std::string log = dir_.path() + "/bad.log";
  Child child({CoordinatorBinary(), "--config", config}, log);
  ASSERT_TRUE(child.started());
  auto code = child.WaitExit(5s);
  ASSERT_TRUE(code.has_value()) << "gridsync-coordinator did not exit on a bad config";
  EXPECT_EQ(*code, 2);
  EXPECT_NE(ReadFile(log).find("distributed.master_port"), std::string::npos) << ReadFile(log);

  Child missing({CoordinatorBinary(), "--config", dir_.path() + "/no-such.json"},
                dir_.path() + "/missing.log");
  auto missing_code = missing.WaitExit(5s);
  ASSERT_TRUE(missing_code.has_value());
  EXPECT_EQ(*missing_code, 2);
}

TEST_F(CoordinatorBinaryTest, ServesAClientAndExitsZeroOnSigterm) {
  const uint16_t port = UnusedPort();
  const std::string config = dir_.Write(
      "good.json",
      "// a distributed job of 2 workers and 1 shard, all on this machine\n"
      "{\"distributed\": {\"enable\": true, \"world_size\": 2, \"master_addr\": \"127.0.0.1\", "
      "\"master_port\": 1, \"gradient_sync\": \"ps\"}, \"ps\": {\"shards\": 1}}");
  const std::string log = dir_.path() + "/good.log";
  Child child({CoordinatorBinary(), "--config", config, "--set",
               "distributed.master_port=" + std::to_string(port), "--log-level", "info"},
              log);
  ASSERT_TRUE(child.started());

  // What a shard or worker running this config registers with.
  auto loaded = Config::LoadFile(config);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  auto spec = RunSpec::Resolve(*loaded);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const std::vector<Setting> shared = SharedSettings(*spec);

  auto client = CoordinatorClient::Connect("127.0.0.1", port, 5s);
  ASSERT_TRUE(client.ok()) << client.status().ToString() << "\n" << ReadFile(log);
  auto map = (*client)->GetMap(false, 0ms);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  EXPECT_EQ(map->expected_shards, 1u);
  EXPECT_EQ(map->expected_workers, 2u);

  {
    auto worker = CoordinatorClient::Connect("127.0.0.1", port, 2s);
    ASSERT_TRUE(worker.ok());
    RegisterInfo info = Member(Role::kWorker, -1);
    info.node = "node-x";
    info.pid = 4242;
    // The coordinator's config defines the cluster's settings: a member
    // without them is refused, though it registers first.
    auto bare = (*worker)->Register(info, 2s);
    ASSERT_FALSE(bare.ok()) << "a first member without the config's settings was let in";
    EXPECT_NE(bare.status().message().find("(set by the coordinator's config " + config +
                                           "): checkpoint.every_steps: (not sent) here, 0 there"),
              std::string::npos)
        << bare.status().message();
    info.shared_settings = shared;
    auto reg = (*worker)->Register(info, 2s);
    ASSERT_TRUE(reg.ok()) << reg.status().ToString();
    EXPECT_EQ(reg->rank, 0u);
    ASSERT_TRUE((*worker)->Set("rendezvous", "127.0.0.1:1234").ok());
  }  // the worker leaves: the coordinator logs it by role, rank, node and pid
  auto value = (*client)->Get({"rendezvous"}, 1s);
  ASSERT_TRUE(value.ok()) << value.status().ToString();
  EXPECT_EQ(value->at(0), "127.0.0.1:1234");

  const std::string left = "worker 0 left (node 'node-x', pid 4242";
  const auto start = Clock::now();
  while (ReadFile(log).find(left) == std::string::npos && Since(start) < 3s)
    std::this_thread::sleep_for(20ms);
  EXPECT_NE(ReadFile(log).find(left), std::string::npos) << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("[warning] worker 0 left (node"), std::string::npos)
      << "leaving in the middle of a job is a warning:\n"
      << ReadFile(log);

  {
    // A worker of the next job passes the "done" barrier, then leaves: the
    // normal end of a job, logged as information.
    auto worker = CoordinatorClient::Connect("127.0.0.1", port, 2s);
    ASSERT_TRUE(worker.ok());
    RegisterInfo info = Member(Role::kWorker, -1);
    info.node = "node-y";
    info.shared_settings = shared;
    auto reg = (*worker)->Register(info, 2s);
    ASSERT_TRUE(reg.ok()) << reg.status().ToString();
    ASSERT_TRUE((*worker)->Barrier("done", 1, "worker-0", 2s).ok());
  }
  const std::string ended = "[info] worker 0 left after the job ended (node 'node-y'";
  const auto again = Clock::now();
  while (ReadFile(log).find(ended) == std::string::npos && Since(again) < 3s)
    std::this_thread::sleep_for(20ms);
  EXPECT_NE(ReadFile(log).find(ended), std::string::npos) << ReadFile(log);

  // SIGHUP (a closed terminal, a log rotator) does not end a service that
  // has nothing to reload: it keeps serving (a hostile probe's SIGHUP ended
  // a shard and a worker, and with them the job).
  child.Signal(SIGHUP);
  EXPECT_FALSE(child.WaitExit(300ms).has_value()) << "SIGHUP ended the coordinator";
  auto after_hup = CoordinatorClient::Connect("127.0.0.1", port, 2s);
  ASSERT_TRUE(after_hup.ok()) << after_hup.status().ToString();
  EXPECT_TRUE((*after_hup)->Heartbeat().ok());
  // ... and says so, once per signal (it was silent).
  const std::string hup_line = "received SIGHUP; ignored: the config is read once";
  const auto hup_at = Clock::now();
  while (ReadFile(log).find(hup_line) == std::string::npos && Since(hup_at) < 3s)
    std::this_thread::sleep_for(20ms);
  EXPECT_NE(ReadFile(log).find(hup_line), std::string::npos) << ReadFile(log);

  child.Signal(SIGTERM);
  auto code = child.WaitExit(5s);
  ASSERT_TRUE(code.has_value()) << "gridsync-coordinator did not exit on SIGTERM";
  EXPECT_EQ(*code, 0) << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("listening on 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << ReadFile(log);
}

// ---- systemd: readiness and the watchdog, over a real notify socket ----

// A datagram socket standing in for systemd's NOTIFY_SOCKET.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    bound_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~NotifySocket() {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  bool bound() const { return bound_; }
  // The next message, or "" when none arrives within `timeout`.
  std::string Next(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return "";
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

// Sets systemd's variables for the scope of a test.
class SystemdEnvironment {
 public:
  SystemdEnvironment(const std::string& socket, const std::string& watchdog_usec) {
    ::setenv("NOTIFY_SOCKET", socket.c_str(), 1);
    ::setenv("WATCHDOG_USEC", watchdog_usec.c_str(), 1);
    ::unsetenv("WATCHDOG_PID");  // unset: whoever reads it is the service
  }
  ~SystemdEnvironment() {
    ::unsetenv("NOTIFY_SOCKET");
    ::unsetenv("WATCHDOG_USEC");
  }
};

TEST_F(CoordinatorBinaryTest, WatchdogPingsOnlyWhileTheServingLoopTurns) {
  NotifySocket socket(dir_.path() + "/notify");
  ASSERT_TRUE(socket.bound());
  SystemdEnvironment env(dir_.path() + "/notify", "300000");
  auto watchdog = ServiceWatchdog::FromEnvironment();
  ASSERT_TRUE(watchdog.enabled());
  EXPECT_EQ(watchdog.interval(), 100ms);
  EXPECT_TRUE(watchdog.Tick(7));
  EXPECT_EQ(socket.Next(1s), "WATCHDOG=1");
  EXPECT_FALSE(watchdog.Tick(7)) << "a loop that did not turn must not feed the watchdog";
  EXPECT_EQ(socket.Next(200ms), "");
  EXPECT_TRUE(watchdog.Tick(8));
  EXPECT_EQ(socket.Next(1s), "WATCHDOG=1");

  ::unsetenv("WATCHDOG_USEC");
  EXPECT_FALSE(ServiceWatchdog::FromEnvironment().enabled()) << "outside systemd: no watchdog";
}

// A worker's unit has a fixed WatchdogSec=; the worker retunes it to its
// config's timeout (WorkerWatchdogTimeout) and pings at a third of that.
TEST_F(CoordinatorBinaryTest, WorkerPingerRetunesTheWatchdogToItsTimeout) {
  NotifySocket socket(dir_.path() + "/notify");
  ASSERT_TRUE(socket.bound());
  SystemdEnvironment env(dir_.path() + "/notify", "15000000");  // the unit's 15 s
  WatchdogPinger pinger(ServiceWatchdog::FromEnvironment());
  ASSERT_TRUE(pinger.enabled());
  EXPECT_EQ(socket.Next(1s), "WATCHDOG=1");
  EXPECT_EQ(WorkerWatchdogTimeout(30.0), 15s);
  EXPECT_EQ(WorkerWatchdogTimeout(120.0), 60s);
  EXPECT_EQ(WorkerWatchdogTimeout(1.0), 3s) << "at least 3 s";
  pinger.Retune(300ms);
  EXPECT_EQ(socket.Next(1s), "WATCHDOG=1\nWATCHDOG_USEC=300000");
  // Every third of the new timeout from now on (the old one: every 5 s).
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(socket.Next(1s), "WATCHDOG=1");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);

  ::unsetenv("WATCHDOG_USEC");
  WatchdogPinger outside(ServiceWatchdog::FromEnvironment());
  EXPECT_FALSE(outside.enabled());
  outside.Retune(300ms);  // outside systemd: nothing to tell
}

// A shard's watchdog, fed from a thread of its own (its main loop waits up
// to timeout_s on the coordinator: a hostile probe saw a healthy shard
// killed as hung), still pings only while its serving loop turns.
TEST_F(CoordinatorBinaryTest, PingerWithProgressPingsOnlyWhileItMoves) {
  NotifySocket socket(dir_.path() + "/notify");
  ASSERT_TRUE(socket.bound());
  SystemdEnvironment env(dir_.path() + "/notify", "150000");  // a ping every 50 ms
  std::atomic<uint64_t> turns{0};
  WatchdogPinger pinger(ServiceWatchdog::FromEnvironment(), [&turns] { return turns.load(); });
  ASSERT_TRUE(pinger.enabled());
  EXPECT_EQ(socket.Next(1s), "WATCHDOG=1") << "the first always goes";
  EXPECT_EQ(socket.Next(300ms), "") << "a loop that did not turn must not feed the watchdog";
  turns = 1;
  EXPECT_EQ(socket.Next(1s), "WATCHDOG=1");
}

TEST_F(CoordinatorBinaryTest, TellsSystemdItIsReadyFeedsTheWatchdogAndStops) {
  NotifySocket socket(dir_.path() + "/notify");
  ASSERT_TRUE(socket.bound());
  const uint16_t port = UnusedPort();
  const std::string config =
      dir_.Write("notify.json",
                 "{\"distributed\": {\"enable\": true, \"world_size\": 1, \"master_addr\": "
                 "\"127.0.0.1\", \"gradient_sync\": \"ps\"}, \"ps\": {\"shards\": 1}}");
  std::optional<Child> child;
  {
    SystemdEnvironment env(dir_.path() + "/notify", "600000");  // WatchdogSec=0.6
    child.emplace(std::vector<std::string>{CoordinatorBinary(), "--config", config, "--port",
                                           std::to_string(port)},
                  dir_.path() + "/notify.log");
  }
  ASSERT_TRUE(child->started());
  // First the start it may take (ServerStartTimeout of timeout_s 30: 90 s),
  // since the unit's TimeoutStartSec= cannot know timeout_s; then READY=1.
  const std::string start_timeout = socket.Next(5s);
  EXPECT_EQ(start_timeout, "EXTEND_TIMEOUT_USEC=90000000") << ReadFile(dir_.path() + "/notify.log");
  const std::string ready = socket.Next(5s);
  EXPECT_EQ(ready.rfind("READY=1", 0), 0u) << "second message: '" << ready << "'\n"
                                           << ReadFile(dir_.path() + "/notify.log");
  // A ping every third of the timeout (200 ms) while serving: 5 in 1.5 s.
  int pings = 0;
  const auto start = Clock::now();
  while (Since(start) < 1500ms) pings += socket.Next(300ms) == "WATCHDOG=1";
  EXPECT_GE(pings, 5);
  EXPECT_LE(pings, 9);
  child->Signal(SIGTERM);
  std::string last;
  for (std::string m = socket.Next(3s); !m.empty(); m = socket.Next(1s)) last = m;
  EXPECT_EQ(last, "STOPPING=1");
  auto code = child->WaitExit(5s);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0);
}

}  // namespace
}  // namespace gridsync
