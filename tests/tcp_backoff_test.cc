// The retransmission backoff cap (common/tcp_backoff.h) on the
// coordinator's connections, at both ends, and on Gloo's pairs, read back
// from the real sockets of real connections (this process holds both
// ends): before, they carried the kernel's 120 s; and the data plane's
// (ZeroMQ's) connections, at the shard's end and the worker's. Capping keeps when TCP gives up: the
// coordinator's own dead_peer_after, and elsewhere the uncapped kernel's time. On a kernel without
// the option (before Linux 6.15), or one whose default is already 1 s, the tests that need it skip,
// saying so.
#include "common/tcp_backoff.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/coordinator_client.h"
#include "common/store.h"
#include "server/coordinator.h"
#include "server/ps_shard.h"
#include "tools/bench_shard_map.h"
#include "worker/collective/gloo_collective.h"
#include "worker/ps_client.h"

namespace gridsync {
namespace {

using namespace std::chrono_literals;

// The cap of a fresh socket: the kernel's default (or the host's
// net.ipv4.tcp_rto_max_ms), -1 where there is no such option.
int KernelDefaultCap() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -2;
  const int ms = RetransmitBackoffCapMs(fd);
  close(fd);
  return ms;
}

#define SKIP_UNLESS_THE_CAP_CAN_SHOW()                                                        \
  do {                                                                                        \
    const int kernel_default = KernelDefaultCap();                                            \
    if (kernel_default < 0) {                                                                 \
      GTEST_SKIP() << "this kernel has no TCP_RTO_MAX_MS (Linux 6.15 added it): connections " \
                      "keep the kernel's backoff";                                            \
    }                                                                                         \
    if (kernel_default <= 1000) {                                                             \
      GTEST_SKIP() << "this host's net.ipv4.tcp_rto_max_ms is " << kernel_default             \
                   << ": every socket is capped already, so a test could not tell";           \
    }                                                                                         \
  } while (0)

unsigned UserTimeoutMs(int fd) {
  unsigned ms = 0;
  socklen_t size = sizeof(ms);
  EXPECT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, &size), 0) << "descriptor " << fd;
  return ms;
}

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

// This process's connected TCP sockets.
std::vector<int> ConnectedTcpSockets() {
  std::vector<int> fds;
  for (const OpenTcpSocket& s : OpenTcpSockets()) {
    if (PortOf(s.fd, true) >= 0) fds.push_back(s.fd);
  }
  return fds;
}

TEST(TcpBackoffTest, UncappedGiveUpIsTheKernelsModel) {
  // tcp_model_timeout with TCP_RTO_MIN 200 ms and TCP_RTO_MAX 120 s.
  EXPECT_EQ(UncappedGiveUp(0), 200ms);
  EXPECT_EQ(UncappedGiveUp(3), 3000ms);
  EXPECT_EQ(UncappedGiveUp(9), 204600ms);
  EXPECT_EQ(UncappedGiveUp(10), 324600ms);
  EXPECT_EQ(UncappedGiveUp(15), 924600ms);  // the default tcp_retries2
}

TEST(TcpBackoffTest, TheCapGrowsWithTheTimeoutSoZeroWindowProbesOutlastIt) {
  EXPECT_EQ(RetransmitCapFor(5s), 1000ms);
  EXPECT_EQ(RetransmitCapFor(12s), 1000ms);
  EXPECT_EQ(RetransmitCapFor(30s), 2500ms);
  EXPECT_EQ(RetransmitCapFor(3600s), 300000ms);
}

TEST(TcpBackoffTest, CapsASocketAtOneSecondWithoutChangingWhenTcpGivesUp) {
  SKIP_UNLESS_THE_CAP_CAN_SHOW();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(CapRetransmitBackoff(fd), "");
  EXPECT_EQ(RetransmitBackoffCapMs(fd), 1000);
  EXPECT_EQ(UserTimeoutMs(fd), static_cast<unsigned>(UncappedGiveUp().count()));
  close(fd);
  // A user timeout already set is the owner's, and stays.
  const int owned = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(owned, 0);
  const unsigned five_s = 5000;
  ASSERT_EQ(setsockopt(owned, IPPROTO_TCP, TCP_USER_TIMEOUT, &five_s, sizeof(five_s)), 0);
  EXPECT_EQ(CapRetransmitBackoff(owned), "");
  EXPECT_EQ(RetransmitBackoffCapMs(owned), 1000);
  EXPECT_EQ(UserTimeoutMs(owned), 5000u);
  close(owned);
  // Not a TCP socket: the reason, not a crash.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  EXPECT_NE(CapRetransmitBackoff(pipe_fds[0]), "");
  EXPECT_EQ(RetransmitBackoffCapMs(pipe_fds[0]), -1);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST(TcpBackoffTest, TheCoordinatorsConnectionsAreCappedAtBothEnds) {
  SKIP_UNLESS_THE_CAP_CAN_SHOW();
  CoordinatorOptions options;
  options.expected_shards = 1;
  options.expected_workers = 1;
  options.dead_peer_after = 7s;
  auto coordinator = Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  auto client = CoordinatorClient::Connect("127.0.0.1", (*coordinator)->port(), 2s);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  // A reply proves the coordinator accepted the connection.
  auto map = (*client)->GetMap(false, 0ms);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  const int port = (*coordinator)->port();
  int client_ends = 0, coordinator_ends = 0;
  for (const int fd : ConnectedTcpSockets()) {
    if (PortOf(fd, true) == port) {
      ++client_ends;
      EXPECT_EQ(RetransmitBackoffCapMs(fd), 1000) << "the client's end";
      EXPECT_EQ(UserTimeoutMs(fd), static_cast<unsigned>(UncappedGiveUp().count()))
          << "the client's end gives up when the uncapped kernel would";
    } else if (PortOf(fd, false) == port) {
      ++coordinator_ends;
      EXPECT_EQ(RetransmitBackoffCapMs(fd), 1000) << "the coordinator's end";
      EXPECT_EQ(UserTimeoutMs(fd), 7000u) << "the coordinator's end keeps dead_peer_after";
    }
  }
  EXPECT_EQ(client_ends, 1);
  EXPECT_EQ(coordinator_ends, 1);
}

TEST(TcpBackoffTest, GloosPairsAreCappedForTheirTimeout) {
  SKIP_UNLESS_THE_CAP_CAN_SHOW();
  std::set<uint64_t> before;
  for (const OpenTcpSocket& s : OpenTcpSockets()) before.insert(s.inode);
  HashStore store;
  std::vector<std::optional<Result<std::unique_ptr<Collective>>>> made(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      GlooCollectiveOptions options;
      options.timeout = 24s;  // a cap of 2 s
      made[static_cast<size_t>(r)].emplace(NewGlooCollective(&store, r, 2, "tcp-backoff", options));
    });
  }
  for (auto& thread : ranks) thread.join();
  for (auto& result : made) ASSERT_TRUE(result->ok()) << result->status().ToString();
  int pair_ends = 0;
  for (const OpenTcpSocket& s : OpenTcpSockets()) {
    if (before.count(s.inode) != 0 || PortOf(s.fd, true) < 0) continue;  // old, or a listener
    ++pair_ends;
    EXPECT_EQ(RetransmitBackoffCapMs(s.fd), 2000) << "descriptor " << s.fd;
    EXPECT_EQ(UserTimeoutMs(s.fd), static_cast<unsigned>(UncappedGiveUp().count()));
  }
  EXPECT_GE(pair_ends, 2) << "both ends of the pair of ranks 0 and 1";
}

// The data plane's connections, at both ends: a shard caps those it
// accepts, a worker those it makes (at its next wait). They kept the
// kernel's backoff, and a link that flapped (1.5 s down, 1 s up, six
// times, each outage well under timeout_s 5) left pushes and replies on a
// 6.5 s timer after the link was back: the waits ran out (a hostile probe).
TEST(TcpBackoffTest, TheDataPlanesConnectionsAreCappedAtBothEnds) {
  SKIP_UNLESS_THE_CAP_CAN_SHOW();
  const std::vector<TableInfo> tables = {{"level", 64, 2}};
  auto partition = Partition::Make(tables, 1, ModelParallelDim::kRow);
  ASSERT_TRUE(partition.ok()) << partition.status().ToString();
  ShardOptions options;
  options.endpoint = "tcp://127.0.0.1:0";
  options.workers = 1;
  options.timeout = 24s;  // a cap of 2 s, as Gloo's pairs get for it
  auto shard = PsShard::Start(*partition, options);
  ASSERT_TRUE(shard.ok()) << shard.status().ToString();
  auto client =
      PsClient::Connect(bench::OneShardMap((*shard)->endpoint(), tables, 1), *partition, 0, 1, 24s);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::vector<float> init(64 * 2, 0.5f);
  // Its wait caps the connection it made (WatchHandshakes).
  const Status pushed = (*client)->Push(wire::Kind::kInit, 0, {{0, true, nullptr, 0, init.data()}});
  ASSERT_TRUE(pushed.ok()) << pushed.ToString();
  const std::string endpoint = (*shard)->endpoint();
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  int worker_end = -1, shard_end = -1;
  // The shard caps on its monitor's thread, as it reads the accept.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  do {
    for (const int fd : ConnectedTcpSockets()) {
      if (PortOf(fd, true) == port) worker_end = RetransmitBackoffCapMs(fd);
      if (PortOf(fd, false) == port) shard_end = RetransmitBackoffCapMs(fd);
    }
    if (worker_end == 2000 && shard_end == 2000) break;
    std::this_thread::sleep_for(20ms);
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(worker_end, 2000) << "the worker's end";
  EXPECT_EQ(shard_end, 2000) << "the shard's end";
  (*client).reset();
  (*shard)->Stop();
}

// ---- Over an emulated network (tools/emulate/netns-cluster.sh) ----

// Two nodes in network namespaces of their own, removed at destruction.
class TwoNodes {
 public:
  // Null, with the reason, where namespaces cannot be made (not root).
  static std::unique_ptr<TwoNodes> Up(std::string* why) {
    if (std::system(("bash " + Script() + " can > /dev/null").c_str()) != 0) {
      *why = "network namespaces need root, ip and tc (" + Script() + " can)";
      return nullptr;
    }
    auto nodes = std::unique_ptr<TwoNodes>(new TwoNodes("gstcp" + std::to_string(getpid())));
    if (std::system(("bash " + Script() + " up " + nodes->name_ + " 2 > /dev/null").c_str()) != 0) {
      *why = "netns-cluster.sh up failed";
      return nullptr;
    }
    return nodes;
  }
  ~TwoNodes() { (void)std::system(("bash " + Script() + " down " + name_).c_str()); }
  TwoNodes(const TwoNodes&) = delete;
  TwoNodes& operator=(const TwoNodes&) = delete;

  // Node i's cable at the switch (no FIN, no RST: packets are lost).
  bool Cable(int i, bool up) const {
    return std::system(("ip netns exec " + name_ + "-hub ip link set p" + std::to_string(i) +
                        (up ? " up" : " down"))
                           .c_str()) == 0;
  }
  // Enters node i's namespace: this thread's sockets are then made there.
  bool Enter(int i) const {
    const std::string path = "/var/run/netns/" + name_ + "-n" + std::to_string(i);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool entered = setns(fd, CLONE_NEWNET) == 0;
    close(fd);
    return entered;
  }
  static std::string Address(int i) { return "10.213.0." + std::to_string(i + 1); }

 private:
  explicit TwoNodes(std::string name) : name_(std::move(name)) {}
  // Tests run from the source tree (gridsync_add_test's working directory).
  static std::string Script() { return "tools/emulate/netns-cluster.sh"; }
  std::string name_;
};

// A reply the coordinator sends while a member's link is down reaches the
// member once the link is back within dead_peer_after. The reply is lost
// and resent: uncapped 0.2, 0.6, 1.4, 3.1 and 6.3 s after it was sent
// (ss -ti: rto 204 ms doubling), so with the link back 4.2 s after the
// send, the next resend came past dead_peer_after (6 s, TCP_USER_TIMEOUT):
// the coordinator dropped the member, and the member's call waited out its
// own timeout. Capped, the resends come every second from 1.4 s on, and
// the first after the outage arrives, about a second after it (5.2 s).
TEST(TcpBackoffNetnsTest, AReplySentIntoAnOutageShorterThanDeadPeerAfterArrives) {
  SKIP_UNLESS_THE_CAP_CAN_SHOW();
  std::string why;
  auto nodes = TwoNodes::Up(&why);
  if (!nodes) GTEST_SKIP() << why;
  CoordinatorOptions options;
  options.bind_host = TwoNodes::Address(0);
  options.expected_shards = 1;
  options.expected_workers = 1;
  options.dead_peer_after = 6s;
  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<CoordinatorClient> setter;  // on node 0, beside the coordinator
  std::thread([&] {
    ASSERT_TRUE(nodes->Enter(0));
    auto started = Coordinator::Start(options);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    coordinator = std::move(started).value();
    auto client = CoordinatorClient::Connect(TwoNodes::Address(0), coordinator->port(), 2s);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    setter = std::move(client).value();
  }).join();
  ASSERT_TRUE(coordinator && setter);

  // Node 1's member waits for a key the coordinator does not hold yet.
  std::atomic<bool> waiting{false};
  std::optional<Result<std::vector<std::string>>> got;
  std::chrono::steady_clock::time_point answered;
  std::thread member([&] {
    ASSERT_TRUE(nodes->Enter(1));
    auto client = CoordinatorClient::Connect(TwoNodes::Address(0), coordinator->port(), 2s);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    waiting = true;
    got.emplace((*client)->Get({"released"}, 12s));
    answered = std::chrono::steady_clock::now();
  });
  while (!waiting) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(300ms);  // the request reached the coordinator

  ASSERT_TRUE(nodes->Cable(1, false));
  std::this_thread::sleep_for(50ms);
  const auto sent = std::chrono::steady_clock::now();
  const Status set = setter->Set("released", "yes");  // the reply goes into the outage
  std::this_thread::sleep_for(4200ms);
  EXPECT_TRUE(nodes->Cable(1, true));
  member.join();
  ASSERT_TRUE(set.ok()) << set.ToString();
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok()) << got->status().ToString();
  EXPECT_EQ((*got)->at(0), "yes");
  const double seconds = std::chrono::duration<double>(answered - sent).count();
  std::printf("the reply came %.2f s after it was sent, %.2f s after the link's return\n", seconds,
              seconds - 4.2);
  EXPECT_LT(seconds, 6.0);
}

}  // namespace
}  // namespace gridsync
