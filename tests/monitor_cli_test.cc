// `gridsync monitor`'s contract with operators: its errors as JSON lines
// under --json, what it says when something other than a coordinator
// answers on the port, and what a member's chosen strings may do to the
// operator's terminal (nothing). Runs the real binary.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "common/coordinator_client.h"
#include "server/coordinator.h"
#include "tests/binary_runner.h"
#include "tests/loopback_listener.h"

namespace {

using binary_runner::Execute;
using binary_runner::ProcessResult;

// Under --json a program reads stdout: an error is a JSON line there too
// (it went to stderr alone, so a reader saw only the end of its input).
TEST(MonitorCliTest, JsonErrorsAreJsonLines) {
  for (const auto& [args, code] : std::vector<std::pair<std::string, int>>{
           {"monitor /nonexistent.json --json --once", 2},
           // A refused flag too (its line came only as text on stderr).
           {"monitor configs/local.json --json --once --interval 0", 2},
           // Port 1 of loopback: nothing listens there.
           {"monitor configs/local.json --set distributed.master_port=1 --json --once "
            "--timeout 0.5",
            1}}) {
    const ProcessResult run = Execute("tools/gridsync", args);
    EXPECT_EQ(run.exit_code, code) << args << ": " << run.output;
    const size_t at = run.output.find("{\"error\":");
    ASSERT_NE(at, std::string::npos) << args << ": " << run.output;
    const std::string line = run.output.substr(at, run.output.find('\n', at) - at);
    const auto parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(parsed.is_discarded()) << line;
    EXPECT_EQ(parsed["error"]["exit_code"], code) << line;
    EXPECT_TRUE(parsed["error"]["message"].is_string()) << line;
    // Unavailable: no coordinator answered (what a worker exits 4 on).
    EXPECT_TRUE(code == 2 ? parsed["error"]["code"] == "IOError" ||
                                parsed["error"]["code"] == "InvalidArgument"
                          : parsed["error"]["code"] == "Unavailable")
        << line;
  }
}

// The wrong port: a peer that hangs up read "receive ... failed: Connection
// reset by peer", and a PS shard's ZeroMQ port "a reply of 255 bytes". Both
// now say what answered.
TEST(MonitorCliTest, APortThatIsNotTheCoordinatorsIsNamedForWhatAnswered) {
  uint16_t port = 0;
  const int listener = gridsync::testing::ListenOnLoopback(&port, 16);
  ASSERT_GE(listener, 0);
  std::atomic<bool> done{false};
  std::thread hang_up([&] {
    while (!done) {
      const int c = ::accept(listener, nullptr, nullptr);
      if (c >= 0) ::close(c);
    }
  });
  const ProcessResult closed = Execute("tools/gridsync",
                                       "monitor configs/local.json --once --timeout 2 --set "
                                       "distributed.master_port=" +
                                           std::to_string(port));
  done = true;
  ::shutdown(listener, SHUT_RDWR);  // wakes accept
  hang_up.join();
  ::close(listener);
  EXPECT_EQ(closed.exit_code, 1) << closed.output;
  EXPECT_NE(closed.output.find("closed the connection"), std::string::npos) << closed.output;
  EXPECT_NE(closed.output.find("or this is not a gridsync coordinator's port"), std::string::npos)
      << closed.output;

  zmq::context_t context(1);
  zmq::socket_t shard_like(context, zmq::socket_type::router);
  shard_like.set(zmq::sockopt::linger, 0);
  shard_like.bind("tcp://127.0.0.1:*");
  const std::string endpoint = shard_like.get(zmq::sockopt::last_endpoint);
  const std::string zmq_port = endpoint.substr(endpoint.rfind(':') + 1);
  const ProcessResult zmtp = Execute("tools/gridsync",
                                     "monitor configs/local.json --once --timeout 2 --set "
                                     "distributed.master_port=" +
                                         zmq_port);
  EXPECT_EQ(zmtp.exit_code, 1) << zmtp.output;
  EXPECT_NE(zmtp.output.find("its first bytes are a ZeroMQ greeting"), std::string::npos)
      << zmtp.output;
}

// A coordinator with one worker registered under `node` (a member chooses
// its node name, and the coordinator lists it as sent), and gridsync
// monitor pointed at it.
class ClusterWithANode {
 public:
  void Start(const std::string& node) {
    gridsync::CoordinatorOptions options;
    options.port = 0;
    options.expected_workers = 1;
    auto coordinator = gridsync::Coordinator::Start(options);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
    coordinator_ = std::move(coordinator).value();
    auto member = gridsync::CoordinatorClient::Connect("127.0.0.1", coordinator_->port(),
                                                       std::chrono::seconds(2));
    ASSERT_TRUE(member.ok()) << member.status().ToString();
    member_ = std::move(member).value();
    gridsync::RegisterInfo info;
    info.role = gridsync::Role::kWorker;
    info.node = node;
    info.tables = {{"grid.level0", 4096, 2}};
    auto registered = member_->Register(info, std::chrono::seconds(2));
    ASSERT_TRUE(registered.ok()) << registered.status().ToString();
  }
  ProcessResult Monitor(const std::string& flags) const {
    return Execute("tools/gridsync", "monitor configs/local.json " + flags +
                                         " --timeout 2 --set distributed.master_port=" +
                                         std::to_string(coordinator_->port()));
  }

 private:
  std::unique_ptr<gridsync::Coordinator> coordinator_;
  std::unique_ptr<gridsync::CoordinatorClient> member_;
};

// A member chooses its node name, and the coordinator lists it as sent:
// the table wrote it raw, so terminal escapes in it cleared or rewrote the
// operator's screen. It is shown with its control bytes escaped.
TEST(MonitorCliTest, AMembersNodeNameCannotDriveTheTerminal) {
  ClusterWithANode cluster;
  ASSERT_NO_FATAL_FAILURE(
      cluster.Start("evil\x1b[2J\x1b]0;owned\x07\xc2\x9b"
                    "2Jx"));
  const ProcessResult run = cluster.Monitor("--once");
  EXPECT_EQ(run.output.find('\x1b'), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find('\x07'), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("\xc2\x9b"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("evil\\x1b[2J\\x1b]0;owned\\x07\\xc2\\x9b2Jx"), std::string::npos)
      << run.output;
}

// Under --json the view is one JSON line: a node name that is not UTF-8
// made the strict dump throw, and monitor ended in std::terminate.
TEST(MonitorCliTest, ANodeNameThatIsNotUtf8KeepsTheJsonViewWhole) {
  ClusterWithANode cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.Start("bad\xff\xfe"));
  const ProcessResult run = cluster.Monitor("--once --json");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  const size_t at = run.output.find('{');
  ASSERT_NE(at, std::string::npos) << run.output;
  const auto parsed = nlohmann::json::parse(run.output.substr(at, run.output.find('\n', at) - at),
                                            nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(parsed.is_discarded()) << run.output;
  ASSERT_TRUE(parsed.contains("workers")) << run.output;
  ASSERT_EQ(parsed["workers"].size(), 1u) << run.output;
  EXPECT_EQ(parsed["workers"][0]["node"], "bad\xef\xbf\xbd\xef\xbf\xbd") << run.output;
}

// JSON escapes C0 controls only: a node name's C1 controls, DEL and bidi
// overrides reached the terminal raw under --json (a hostile probe). The
// view is ASCII, the name kept in \uXXXX escapes.
TEST(MonitorCliTest, TheJsonViewIsAscii) {
  ClusterWithANode cluster;
  ASSERT_NO_FATAL_FAILURE(
      cluster.Start("n\xc2\x9b"
                    "2J\xe2\x80\xaeab\x7f"
                    "c"));
  const ProcessResult run = cluster.Monitor("--once --json");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output.find("\xc2\x9b"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find('\x7f'), std::string::npos) << "DEL left raw: " << run.output;
  EXPECT_EQ(run.output.find("\xe2\x80\xae"), std::string::npos) << run.output;
  const size_t at = run.output.find('{');
  ASSERT_NE(at, std::string::npos) << run.output;
  const auto parsed = nlohmann::json::parse(run.output.substr(at, run.output.find('\n', at) - at),
                                            nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(parsed.is_discarded()) << run.output;
  EXPECT_EQ(parsed["workers"][0]["node"],
            "n\xc2\x9b"
            "2J\xe2\x80\xaeab\x7f"
            "c")
      << run.output;
}

// Members are scraped at once: eight whose endpoints accept and never
// answer held one refresh (and a SIGTERM) eight timeouts, 15 s (a hostile
// probe); now about one.
TEST(MonitorCliTest, SilentMembersCostARefreshOneTimeout) {
  uint16_t port = 0;
  const int silent = gridsync::testing::ListenOnLoopback(&port, 64);
  ASSERT_GE(silent, 0);  // accepted by the kernel, never read or answered
  gridsync::CoordinatorOptions options;
  options.port = 0;
  options.expected_workers = 8;
  auto coordinator = gridsync::Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  std::vector<std::unique_ptr<gridsync::CoordinatorClient>> members;
  for (int rank = 0; rank < 8; ++rank) {
    auto member = gridsync::CoordinatorClient::Connect("127.0.0.1", (*coordinator)->port(),
                                                       std::chrono::seconds(2));
    ASSERT_TRUE(member.ok()) << member.status().ToString();
    gridsync::RegisterInfo info;
    info.role = gridsync::Role::kWorker;
    info.requested_rank = rank;
    info.node = "node";
    info.tables = {{"grid.level0", 4096, 2}};
    ASSERT_TRUE((*member)->Register(info, std::chrono::seconds(2)).ok());
    ASSERT_TRUE(
        (*member)
            ->Set("metrics/worker/" + std::to_string(rank), "127.0.0.1:" + std::to_string(port))
            .ok());
    members.push_back(std::move(member).value());
  }
  const auto start = std::chrono::steady_clock::now();
  const ProcessResult run = Execute("tools/gridsync",
                                    "monitor configs/local.json --once --json --timeout 2 --set "
                                    "distributed.master_port=" +
                                        std::to_string((*coordinator)->port()));
  const auto took = std::chrono::steady_clock::now() - start;
  ::close(silent);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_LT(took, std::chrono::seconds(8)) << run.output;
  EXPECT_NE(run.output.find("no reply within 2000 ms"), std::string::npos) << run.output;
}

}  // namespace
