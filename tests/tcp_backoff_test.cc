// The retransmission backoff cap (common/tcp_backoff.h) is on every TCP
// connection the system makes: the coordinator's at both ends, a shard's
// accepted ZeroMQ connections and a worker's, and Gloo's pairs. Each case
// looks at the real sockets of real connections (this process holds both
// ends) through TCP_RTO_MAX_MS: before, they all carried the kernel's
// 120 s. On a kernel without the option (before Linux 6.15) the tests skip,
// saying so.
#include "common/tcp_backoff.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/coordinator_client.h"
#include "common/sharding.h"
#include "common/store.h"
#include "server/coordinator.h"
#include "server/ps_shard.h"
#include "tools/bench_shard_map.h"
#include "worker/collective/gloo_collective.h"
#include "worker/ps_client.h"

namespace gridsync {
namespace {

using namespace std::chrono_literals;

// The kernel's cap on a fresh socket, or -1 where it has no such option.
int KernelDefaultCap() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int ms = RetransmitBackoffCapMs(fd);
  close(fd);
  return ms;
}

#define SKIP_WITHOUT_RTO_MAX()                                                            \
  if (KernelDefaultCap() < 0)                                                             \
  GTEST_SKIP() << "this kernel has no TCP_RTO_MAX_MS (Linux 6.15 added it): connections " \
                  "keep the kernel's backoff"

int PortOf(int fd, bool peer) {
  sockaddr_storage address{};
  socklen_t size = sizeof(address);
  const int got = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&address), &size)
                       : getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  if (got != 0) return -1;
  if (address.ss_family == AF_INET)
    return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
  }
  return -1;
}

// The caps of this process's connected TCP sockets with `port` at either
// end: both ends of each connection to a server listening there.
std::vector<int> CapsOfConnectionsTo(int port) {
  std::vector<int> caps;
  for (const int fd : OpenTcpSockets()) {
    const int peer = PortOf(fd, true);
    if (peer < 0) continue;  // a listener
    if (peer == port || PortOf(fd, false) == port) caps.push_back(RetransmitBackoffCapMs(fd));
  }
  return caps;
}

int PortOfEndpoint(const std::string& endpoint) {
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

TEST(TcpBackoffTest, CapsASocketAtOneSecondAndRefusesNothingElse) {
  SKIP_WITHOUT_RTO_MAX();
  EXPECT_EQ(KernelDefaultCap(), 120000);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(CapRetransmitBackoff(fd), "");
  EXPECT_EQ(RetransmitBackoffCapMs(fd), 1000);
  // Below the kernel's least (1 s) is raised to it, not refused.
  EXPECT_EQ(CapRetransmitBackoff(fd, 10ms), "");
  EXPECT_EQ(RetransmitBackoffCapMs(fd), 1000);
  close(fd);
  // Not a TCP socket: the reason, not a crash.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  EXPECT_NE(CapRetransmitBackoff(pipe_fds[0]), "");
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST(TcpBackoffTest, TheCoordinatorsConnectionsAreCappedAtBothEnds) {
  SKIP_WITHOUT_RTO_MAX();
  CoordinatorOptions options;
  options.expected_shards = 1;
  options.expected_workers = 1;
  auto coordinator = Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  auto client = CoordinatorClient::Connect("127.0.0.1", (*coordinator)->port(), 2s);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  // A reply proves the coordinator accepted the connection.
  auto map = (*client)->GetMap(false, 0ms);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  const std::vector<int> caps = CapsOfConnectionsTo((*coordinator)->port());
  ASSERT_EQ(caps.size(), 2u) << "the client's end and the coordinator's";
  for (const int cap : caps) EXPECT_EQ(cap, 1000);
}

TEST(TcpBackoffTest, AShardsAndAWorkersDataConnectionsAreCapped) {
  SKIP_WITHOUT_RTO_MAX();
  const std::vector<TableInfo> tables = {{"level0", 64, 2}};
  auto partition = Partition::Make(tables, 1, ModelParallelDim::kRow);
  ASSERT_TRUE(partition.ok()) << partition.status().ToString();
  ShardOptions options;
  options.endpoint = "tcp://127.0.0.1:0";
  options.workers = 1;
  options.consistency = Consistency::kAsync;
  auto shard = PsShard::Start(*partition, options);
  ASSERT_TRUE(shard.ok()) << shard.status().ToString();
  auto client =
      PsClient::Connect(bench::OneShardMap((*shard)->endpoint(), tables, 1), *partition, 0, 1, 5s);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::vector<float> init(64 * 2, 0.5f);
  const Status pushed = (*client)->Push(wire::Kind::kInit, 0, {{0, true, nullptr, 0, init.data()}});
  ASSERT_TRUE(pushed.ok()) << pushed.ToString();
  // The shard's monitor thread caps its end when it reads the accepted
  // event; the worker's end is capped when it awaits a reply after the
  // connected event came (a step's requests, here pushes again).
  const int port = PortOfEndpoint((*shard)->endpoint());
  std::vector<int> caps;
  for (const auto start = std::chrono::steady_clock::now();
       std::chrono::steady_clock::now() - start < 3s; std::this_thread::sleep_for(20ms)) {
    caps = CapsOfConnectionsTo(port);
    if (caps.size() == 2 && caps[0] == 1000 && caps[1] == 1000) break;
    const Status again =
        (*client)->Push(wire::Kind::kInit, 0, {{0, true, nullptr, 0, init.data()}});
    ASSERT_TRUE(again.ok()) << again.ToString();
  }
  ASSERT_EQ(caps.size(), 2u) << "the worker's end and the shard's";
  for (const int fd : OpenTcpSockets()) {
    if (PortOf(fd, true) == port) EXPECT_EQ(RetransmitBackoffCapMs(fd), 1000) << "the worker's end";
    if (PortOf(fd, true) >= 0 && PortOf(fd, false) == port) {
      EXPECT_EQ(RetransmitBackoffCapMs(fd), 1000) << "the shard's end";
    }
  }
}

TEST(TcpBackoffTest, GloosPairsAreCapped) {
  SKIP_WITHOUT_RTO_MAX();
  HashStore store;
  std::vector<std::optional<Result<std::unique_ptr<Collective>>>> made(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      GlooCollectiveOptions options;
      options.timeout = 10s;
      made[static_cast<size_t>(r)].emplace(NewGlooCollective(&store, r, 2, "tcp-backoff", options));
    });
  }
  for (auto& thread : ranks) thread.join();
  for (auto& result : made) ASSERT_TRUE(result->ok()) << result->status().ToString();
  // Every connected TCP socket of this process is one of the pair's ends.
  int connected = 0;
  for (const int fd : OpenTcpSockets()) {
    if (PortOf(fd, true) < 0) continue;
    ++connected;
    EXPECT_EQ(RetransmitBackoffCapMs(fd), 1000) << "descriptor " << fd;
  }
  EXPECT_GE(connected, 2);
}

}  // namespace
}  // namespace gridsync
