// The control plane: gridsync-coordinator's engine in process (threads and
// real sockets on 127.0.0.1), raw malformed bytes against it, the Store seam
// (HashStore and CoordinatorStore with the same checks), and the real
// binary as a child process.
#include "server/coordinator.h"

#include <arpa/inet.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <kj/exception.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/checkpoint_registry.h"
#include "common/cluster_map.h"
#include "common/coordinator_client.h"
#include "common/store.h"
#include "common/wire/gridsync.capnp.h"
#include "ops/service_watchdog.h"
#include "tests/raw_coord_connection.h"

namespace gridsync {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace schema = wire::schema;
using testing::FrameOf;
using testing::LengthPrefix;
using testing::RawConnection;

constexpr auto kConnectTimeout = 2s;

std::chrono::milliseconds Since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

std::vector<TableInfo> Tables() {
  return {{"grid.level0", 4096, 2}, {"grid.level1", 524288, 2}, {"mlp.w0", 64, 32}};
}

RegisterInfo Member(Role role, int32_t rank, std::vector<TableInfo> tables = Tables()) {
  RegisterInfo info;
  info.role = role;
  info.requested_rank = rank;
  info.node = "node-a";
  info.local_rank = rank < 0 ? 0 : static_cast<uint32_t>(rank);
  info.endpoint = role == Role::kShard ? "tcp://127.0.0.1:1" : "";
  info.pid = 1000 + static_cast<uint32_t>(rank + 1);
  info.tables = std::move(tables);
  return info;
}

std::vector<uint32_t> Ranks(const std::vector<MemberInfo>& members) {
  std::vector<uint32_t> ranks;
  for (const auto& m : members) ranks.push_back(m.rank);
  return ranks;
}

// A port nothing listens on (bound once, then released).
uint16_t UnusedPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// ---- In-process coordinator ----

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.port = 0;
    options.expected_shards = 2;
    options.expected_workers = 3;
    auto started = Coordinator::Start(options);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    coordinator_ = std::move(started).value();
    ASSERT_NE(coordinator_->port(), 0);
  }

  std::unique_ptr<CoordinatorClient> Connect() {
    auto client = CoordinatorClient::Connect("127.0.0.1", coordinator_->port(), kConnectTimeout);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(client).value() : nullptr;
  }

  // A connected client registered as role/rank; the rank it got.
  std::unique_ptr<CoordinatorClient> Join(Role role, int32_t rank, uint32_t* got = nullptr) {
    auto client = Connect();
    if (!client) return nullptr;
    auto reg = client->Register(Member(role, rank), 2s);
    EXPECT_TRUE(reg.ok()) << reg.status().ToString();
    if (!reg.ok()) return nullptr;
    if (got) *got = reg->rank;
    return client;
  }

  // The server still serves a well-behaved client.
  void ExpectHealthy() {
    auto client = Connect();
    ASSERT_TRUE(client);
    EXPECT_TRUE(client->Heartbeat().ok());
    ASSERT_TRUE(client->Set("health", "fine").ok());
    auto values = client->Get({"health"}, 0ms);
    ASSERT_TRUE(values.ok()) << values.status().ToString();
    EXPECT_EQ(values->at(0), "fine");
  }

  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(CoordinatorTest, RegistrationAssignsExplicitAndAutomaticRanks) {
  uint32_t rank = 99;
  auto shard1 = Join(Role::kShard, 1, &rank);
  ASSERT_TRUE(shard1);
  EXPECT_EQ(rank, 1u);
  auto shard0 = Join(Role::kShard, -1, &rank);
  ASSERT_TRUE(shard0);
  EXPECT_EQ(rank, 0u);

  auto worker2 = Join(Role::kWorker, 2, &rank);
  ASSERT_TRUE(worker2);
  EXPECT_EQ(rank, 2u);

  auto other = Connect();
  ASSERT_TRUE(other);
  auto duplicate = other->Register(Member(Role::kWorker, 2), 2s);
  ASSERT_FALSE(duplicate.ok());
  EXPECT_EQ(duplicate.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(duplicate.status().message().find("worker rank 2 is already taken"), std::string::npos)
      << duplicate.status().message();
  auto shard_full = other->Register(Member(Role::kShard, -1), 2s);
  ASSERT_FALSE(shard_full.ok());
  EXPECT_NE(shard_full.status().message().find("all 2 shard ranks taken"), std::string::npos)
      << shard_full.status().message();
  auto out_of_range = other->Register(Member(Role::kWorker, 7), 2s);
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_NE(out_of_range.status().message().find("out of range"), std::string::npos)
      << out_of_range.status().message();

  auto worker0 = Join(Role::kWorker, -1, &rank);
  ASSERT_TRUE(worker0);
  EXPECT_EQ(rank, 0u);
  // The refused connection can still register; it gets the last free rank.
  auto reg = other->Register(Member(Role::kWorker, -1), 2s);
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  EXPECT_EQ(reg->rank, 1u);
  EXPECT_TRUE(reg->map.complete());
  EXPECT_EQ(Ranks(reg->map.shards), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(Ranks(reg->map.workers), (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(reg->map.shards[0].endpoint, "tcp://127.0.0.1:1");
  EXPECT_EQ(reg->map.workers[2].pid, 1003u);
  EXPECT_EQ(reg->map.tables, Tables());
  EXPECT_EQ(reg->map.generation, 5u);  // five joins

  auto again = other->Register(Member(Role::kWorker, -1), 2s);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("already registered"), std::string::npos);

  auto extra = Connect();
  ASSERT_TRUE(extra);
  auto too_many = extra->Register(Member(Role::kWorker, -1), 2s);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("all 3 worker ranks taken"), std::string::npos)
      << too_many.status().message();

  // Observers get the map and no rank.
  auto observer = extra->Register(Member(Role::kObserver, -1, {}), 2s);
  ASSERT_TRUE(observer.ok()) << observer.status().ToString();
  EXPECT_EQ(observer->map.workers.size(), 3u);
  EXPECT_EQ(observer->map.generation, 5u);
}

TEST_F(CoordinatorTest, TableMismatchIsRefusedNamingTableAndSizes) {
  auto shard = Join(Role::kShard, 0);
  ASSERT_TRUE(shard);

  auto worker = Connect();
  ASSERT_TRUE(worker);
  auto tables = Tables();
  tables[1].rows = 262144;
  auto reg = worker->Register(Member(Role::kWorker, 0, tables), 2s);
  ASSERT_FALSE(reg.ok());
  EXPECT_EQ(reg.status().code(), StatusCode::kInvalidArgument);
  const std::string& text = reg.status().message();
  EXPECT_NE(text.find("'grid.level1'"), std::string::npos) << text;
  EXPECT_NE(text.find("262144 x 2"), std::string::npos) << text;
  EXPECT_NE(text.find("524288 x 2"), std::string::npos) << text;
  EXPECT_NE(text.find("shard 0"), std::string::npos) << text;  // who defined them
  EXPECT_EQ(text.find("grid.level0"), std::string::npos) << "names the first differing table: " << text;

  auto shorter = Tables();
  shorter.pop_back();
  auto reg2 = worker->Register(Member(Role::kWorker, 0, shorter), 2s);
  ASSERT_FALSE(reg2.ok());
  EXPECT_NE(reg2.status().message().find("'mlp.w0' (64 x 32)"), std::string::npos) << reg2.status().message();

  auto good = worker->Register(Member(Role::kWorker, 0), 2s);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->map.workers.size(), 1u);
}

TEST_F(CoordinatorTest, GenerationBumpsOnJoinAndOnDisconnect) {
  auto observer = Connect();
  ASSERT_TRUE(observer);
  auto before = observer->GetMap(false, 0ms);
  ASSERT_TRUE(before.ok()) << before.status().ToString();

  uint32_t rank = 0;
  auto worker = Join(Role::kWorker, 1, &rank);
  ASSERT_TRUE(worker);
  auto joined = observer->GetMap(false, 0ms);
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->generation, before->generation + 1);
  ASSERT_EQ(joined->workers.size(), 1u);
  EXPECT_EQ(joined->workers[0].rank, 1u);

  worker.reset();  // closes the connection
  ClusterMap after;
  const auto start = Clock::now();
  do {
    auto map = observer->GetMap(false, 0ms);
    ASSERT_TRUE(map.ok());
    after = *map;
    if (after.generation != joined->generation) break;
    std::this_thread::sleep_for(10ms);
  } while (Since(start) < 3s);
  EXPECT_EQ(after.generation, joined->generation + 1);
  EXPECT_TRUE(after.workers.empty());

  // The rank is free again.
  auto back = Join(Role::kWorker, 1);
  EXPECT_TRUE(back);
}

// The collectives' rendezvous state (Gloo's addresses, NCCL's ids, the
// backend vote) goes when the last worker leaves: the next job's workers
// reuse the group names, and a second nccl-mode job on a long-lived
// coordinator used to wait for the first job's Gloo peers. Other keys stay.
TEST_F(CoordinatorTest, TheLastWorkerLeavingDropsTheCollectivesRendezvousKeys) {
  auto observer = Connect();
  ASSERT_TRUE(observer);
  auto first = Join(Role::kWorker, 0);
  auto second = Join(Role::kWorker, 1);
  ASSERT_TRUE(first && second);
  const std::string gloo = std::string(kCollectiveStorePrefix) + "gloo/flat/0";
  ASSERT_TRUE(first->Set(gloo, "127.0.0.1:1234").ok());
  ASSERT_TRUE(first->Set("metrics/worker/0", "127.0.0.1:9100").ok());

  first.reset();  // one worker left: its peers' rendezvous state stays
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(observer->Get({gloo}, 0ms).ok());

  second.reset();  // the last one
  bool gone = false;
  const auto start = Clock::now();
  while (!gone && Since(start) < 3s) {
    gone = !observer->Get({gloo}, 0ms).ok();
    if (!gone) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(gone) << gloo << " outlived the workers";
  auto other = observer->Get({"metrics/worker/0"}, 0ms);
  EXPECT_TRUE(other.ok()) << other.status().ToString();
}

// Issue 10: a shard restarted after a crash used to rejoin the running job
// with fresh parameters. Once the workers passed "init", a shard's
// registration is refused, pointing at --resume; a new job (everyone left)
// accepts shards again.
TEST_F(CoordinatorTest, AShardRestartedDuringTrainingIsRefused) {
  auto shard = Join(Role::kShard, 0);
  auto worker = Join(Role::kWorker, 0);
  ASSERT_TRUE(shard && worker);
  ASSERT_TRUE(worker->Barrier("init", 1, "worker-0", 2s).ok());
  shard.reset();  // the shard process dies
  auto observer = Connect();
  for (auto start = Clock::now(); Since(start) < 3s;) {
    auto map = observer->GetMap(false, 0ms);
    ASSERT_TRUE(map.ok());
    if (map->shards.empty()) break;
    std::this_thread::sleep_for(10ms);
  }
  auto restarted = Connect();
  auto refused = restarted->Register(Member(Role::kShard, 0), 2s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("fresh parameters"), std::string::npos)
      << refused.status().ToString();
  // The job ends; the next job's shards register.
  worker.reset();
  restarted.reset();
  std::unique_ptr<CoordinatorClient> next;
  for (auto start = Clock::now(); Since(start) < 3s && !next;) {
    auto client = Connect();
    if (client->Register(Member(Role::kShard, 0), 2s).ok())
      next = std::move(client);
    else
      std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(next) << "a new job could not register its shard";
}

TEST_F(CoordinatorTest, AShardRejoiningFromACheckpointMovesTheEpoch) {
  // Before training, nothing can be rejoined.
  auto early = Connect();
  RegisterInfo info = Member(Role::kShard, 0);
  info.rejoin_step = 50;
  auto refused = early->Register(info, 2s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("has not started"), std::string::npos)
      << refused.status().ToString();
  early.reset();
  // Nor by a worker.
  auto worker_try = Connect();
  RegisterInfo worker_info = Member(Role::kWorker, 1);
  worker_info.rejoin_step = 50;
  EXPECT_FALSE(worker_try->Register(worker_info, 2s).ok());
  worker_try.reset();

  std::unique_ptr<CoordinatorClient> shard;
  for (auto start = Clock::now(); Since(start) < 3s && !shard;) {
    auto client = Connect();
    if (client->Register(Member(Role::kShard, 0), 2s).ok())
      shard = std::move(client);
    else
      std::this_thread::sleep_for(10ms);
  }
  auto worker = Join(Role::kWorker, 0);
  ASSERT_TRUE(shard && worker);
  ASSERT_TRUE(worker->Barrier("init", 1, "worker-0", 2s).ok());
  auto before = worker->CurrentJob();
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->epoch, 0u);
  // What the parts published of their checkpoints: 150 is every part's.
  ASSERT_TRUE(worker->Set(CheckpointKey(before->job, "shard-0"), "100,150").ok());
  ASSERT_TRUE(worker->Set(CheckpointKey(before->job, "shard-1"), "150").ok());
  shard.reset();  // the shard process dies
  // A step not every part holds is refused, naming the part.
  for (auto start = Clock::now(); Since(start) < 3s;) {
    auto client = Connect();
    RegisterInfo claim = Member(Role::kShard, 0);
    claim.rejoin_step = 100;
    auto reg = client->Register(claim, 2s);
    ASSERT_FALSE(reg.ok()) << "a step shard-1 does not hold was accepted";
    if (reg.status().message().find("already taken") != std::string::npos) {
      std::this_thread::sleep_for(10ms);
      continue;
    }
    EXPECT_NE(reg.status().message().find("part shard-1 does not hold it"), std::string::npos)
        << reg.status().ToString();
    break;
  }
  std::unique_ptr<CoordinatorClient> rejoined;
  CoordinatorClient::Registration registration;
  for (auto start = Clock::now(); Since(start) < 3s && !rejoined;) {
    auto client = Connect();
    RegisterInfo again = Member(Role::kShard, 0);
    again.rejoin_step = 150;
    auto reg = client->Register(again, 2s);
    if (reg.ok()) {
      rejoined = std::move(client);
      registration = *reg;
    } else {
      std::this_thread::sleep_for(10ms);  // the dead one is still registered
    }
  }
  ASSERT_TRUE(rejoined) << "the restarted shard could not rejoin";
  EXPECT_EQ(registration.map.epoch, 1u);
  EXPECT_EQ(registration.map.resume_step, 150u);
  auto after = worker->CurrentJob();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->job, before->job);
  EXPECT_EQ(after->epoch, 1u);
  EXPECT_EQ(after->resume_step, 150u);
  // Its last worker dies before the end: with checkpoints published, the
  // job stays open for restarted workers to rejoin.
  worker.reset();
  auto observer = Connect();
  for (auto start = Clock::now(); Since(start) < 1s;) {
    auto map = observer->GetMap(false, 0ms);
    ASSERT_TRUE(map.ok());
    if (map->workers.empty()) break;
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(100ms);
  auto kept = observer->CurrentJob();
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->job, before->job) << "a job with checkpoints ended when its workers died";
  EXPECT_EQ(kept->epoch, 1u);
}

TEST_F(CoordinatorTest, WaitCompleteReturnsWhenTheLastMemberJoins) {
  std::vector<std::unique_ptr<CoordinatorClient>> members;
  for (int r = 0; r < 2; ++r) members.push_back(Join(Role::kShard, r));
  for (int r = 0; r < 2; ++r) members.push_back(Join(Role::kWorker, r));
  for (const auto& m : members) ASSERT_TRUE(m);

  auto observer = Connect();
  ASSERT_TRUE(observer);
  std::atomic<bool> returned{false};
  std::optional<Result<ClusterMap>> result;
  std::chrono::milliseconds waited{};
  std::thread waiter([&] {
    const auto start = Clock::now();
    result.emplace(observer->GetMap(true, 5s));
    waited = Since(start);
    returned = true;
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(returned.load()) << "getMap(waitComplete) returned before the cluster was complete";
  auto last = Join(Role::kWorker, 2);
  waiter.join();
  ASSERT_TRUE(last);
  ASSERT_TRUE(result.has_value());
  ASSERT_TRUE(result->ok()) << result->status().ToString();
  EXPECT_TRUE((*result)->complete());
  EXPECT_EQ((*result)->workers.size(), 3u);
  EXPECT_GE(waited, 150ms);
  EXPECT_LT(waited, 4s);
}

TEST_F(CoordinatorTest, WaitCompleteTimesOutNamingMissingRanks) {
  auto shard = Join(Role::kShard, 0);
  auto worker = Join(Role::kWorker, 1);
  ASSERT_TRUE(shard && worker);
  auto observer = Connect();
  ASSERT_TRUE(observer);
  const auto start = Clock::now();
  auto map = observer->GetMap(true, 300ms);
  const auto waited = Since(start);
  ASSERT_FALSE(map.ok());
  EXPECT_EQ(map.status().code(), StatusCode::kTimeout);
  EXPECT_NE(map.status().message().find("cluster incomplete after 0.3 s: missing shards [1], workers [0, 2]"),
            std::string::npos)
      << map.status().message();
  EXPECT_GE(waited, 250ms);
  EXPECT_LT(waited, 2s);
  // The connection stays usable after a server-side timeout.
  EXPECT_TRUE(observer->Heartbeat().ok());
}

TEST_F(CoordinatorTest, BarrierWithThreeThreadsCompletesAndIsReusable) {
  constexpr int kMembers = 3;
  constexpr int kRounds = 2;
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  for (int i = 0; i < kMembers; ++i) {
    clients.push_back(Connect());
    ASSERT_TRUE(clients.back());
  }
  std::vector<std::vector<Status>> statuses(kMembers, std::vector<Status>(kRounds));
  std::vector<std::vector<std::chrono::milliseconds>> waited(kMembers,
                                                            std::vector<std::chrono::milliseconds>(kRounds));
  std::vector<std::thread> threads;
  for (int i = 0; i < kMembers; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < kRounds; ++round) {
        if (i == kMembers - 1) std::this_thread::sleep_for(200ms);  // the late one
        const auto start = Clock::now();
        statuses[i][round] = clients[i]->Barrier("step", kMembers, "worker-" + std::to_string(i), 5s);
        waited[i][round] = Since(start);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kMembers; ++i) {
    for (int round = 0; round < kRounds; ++round) {
      EXPECT_TRUE(statuses[i][round].ok()) << "member " << i << " round " << round << ": "
                                           << statuses[i][round].ToString();
      if (i < kMembers - 1) {
        // Every round waits for the late member again: a completed barrier
        // does not let the next round through.
        EXPECT_GE(waited[i][round], 120ms) << "member " << i << " round " << round;
      }
    }
  }
}

TEST_F(CoordinatorTest, BarrierTimeoutNamesTheMissingMember) {
  auto w0 = Join(Role::kWorker, 0);
  auto w1 = Join(Role::kWorker, 1);
  ASSERT_TRUE(w0 && w1);
  // worker-0 arrives first and waits longest; worker-1 arrives second and
  // times out first, while both are there.
  Status s0, s1;
  std::thread t0([&] { s0 = w0->Barrier("init", 3, "worker-0", 700ms); });
  std::this_thread::sleep_for(100ms);
  std::thread t1([&] { s1 = w1->Barrier("init", 3, "worker-1", 300ms); });
  t0.join();
  t1.join();
  for (const Status* s : {&s0, &s1}) {
    ASSERT_FALSE(s->ok());
    EXPECT_EQ(s->code(), StatusCode::kTimeout);
  }
  EXPECT_NE(s1.message().find("barrier 'init' timed out after 0.3 s: 2 of 3 arrived (worker-0, worker-1); "
                              "missing: worker-2"),
            std::string::npos)
      << s1.message();
  // worker-1 gave up, so it is missing too by the time worker-0 gives up.
  EXPECT_NE(s0.message().find("barrier 'init' timed out after 0.7 s: 1 of 3 arrived (worker-0); "
                              "missing: worker-1, worker-2"),
            std::string::npos)
      << s0.message();
}

TEST_F(CoordinatorTest, KvSetThenGetInKeyOrder) {
  auto client = Connect();
  ASSERT_TRUE(client);
  const std::string binary("\0\x01\xff nccl-id", 12);
  ASSERT_TRUE(client->Set("a", "alpha").ok());
  ASSERT_TRUE(client->Set("b", binary).ok());
  ASSERT_TRUE(client->Set("a", "alpha2").ok());  // overwrite
  auto values = client->Get({"b", "a"}, 0ms);
  ASSERT_TRUE(values.ok()) << values.status().ToString();
  EXPECT_EQ(*values, (std::vector<std::string>{binary, "alpha2"}));
  auto other = Connect();
  ASSERT_TRUE(other);
  auto seen = other->Get({"a"}, 100ms);
  ASSERT_TRUE(seen.ok());
  EXPECT_EQ(seen->at(0), "alpha2");
}

TEST_F(CoordinatorTest, KvGetWaitsForALaterSet) {
  auto getter = Connect();
  auto setter = Connect();
  ASSERT_TRUE(getter && setter);
  std::optional<Result<std::vector<std::string>>> got;
  std::chrono::milliseconds waited{};
  std::thread thread([&] {
    const auto start = Clock::now();
    got.emplace(getter->Get({"late", "early"}, 5s));
    waited = Since(start);
  });
  ASSERT_TRUE(setter->Set("early", "1").ok());
  std::this_thread::sleep_for(150ms);
  ASSERT_TRUE(setter->Set("late", "2").ok());
  thread.join();
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok()) << got->status().ToString();
  EXPECT_EQ(**got, (std::vector<std::string>{"2", "1"}));
  EXPECT_GE(waited, 100ms);
  EXPECT_LT(waited, 4s);
}

TEST_F(CoordinatorTest, KvGetTimeoutNamesTheMissingKey) {
  auto client = Connect();
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->Set("present", "x").ok());
  const auto start = Clock::now();
  auto timed_out = client->Get({"present", "nccl/unique-id"}, 200ms);
  EXPECT_LT(Since(start), 2s);
  ASSERT_FALSE(timed_out.ok());
  EXPECT_EQ(timed_out.status().code(), StatusCode::kTimeout);
  EXPECT_NE(timed_out.status().message().find("'nccl/unique-id'"), std::string::npos)
      << timed_out.status().message();
  EXPECT_EQ(timed_out.status().message().find("'present'"), std::string::npos) << timed_out.status().message();

  auto not_found = client->Get({"nccl/unique-id"}, 0ms);
  ASSERT_FALSE(not_found.ok());
  EXPECT_EQ(not_found.status().code(), StatusCode::kNotFound);
  EXPECT_NE(not_found.status().message().find("'nccl/unique-id'"), std::string::npos);
}

TEST_F(CoordinatorTest, StopCancelsDeferredRepliesCleanly) {
  auto client = Connect();
  ASSERT_TRUE(client);
  std::optional<Result<std::vector<std::string>>> got;
  std::thread thread([&] { got.emplace(client->Get({"never"}, 10s)); });
  std::this_thread::sleep_for(100ms);
  const auto start = Clock::now();
  coordinator_->Stop();
  thread.join();
  EXPECT_LT(Since(start), 2s);
  ASSERT_TRUE(got.has_value());
  ASSERT_FALSE(got->ok());
  EXPECT_EQ(got->status().code(), StatusCode::kIOError) << got->status().ToString();
  coordinator_->Stop();  // idempotent
}

// ---- The Store seam: same checks for both implementations ----

// `reader` and `writer` may be the same store; a CoordinatorStore needs two
// connections because a client serialises its calls.
void ExerciseStore(Store& reader, Store& writer, const std::string& missing_name) {
  ASSERT_TRUE(writer.Set("k1", "v1").ok());
  ASSERT_TRUE(writer.Set("k2", std::string("\0v2", 3)).ok());
  auto both = reader.Get({"k2", "k1"}, 0ms);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(*both, (std::vector<std::string>{std::string("\0v2", 3), "v1"}));

  std::optional<Result<std::vector<std::string>>> later;
  std::atomic<bool> returned{false};
  std::thread thread([&] {
    later.emplace(reader.Get({"k3"}, 5s));
    returned = true;
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(returned.load()) << "get must wait for a key that is not set yet";
  ASSERT_TRUE(writer.Set("k3", "v3").ok());
  thread.join();
  ASSERT_TRUE(later.has_value());
  ASSERT_TRUE(later->ok()) << later->status().ToString();
  EXPECT_EQ((*later)->at(0), "v3");

  const auto start = Clock::now();
  auto timed_out = reader.Get({"k1", "absent"}, 150ms);
  EXPECT_GE(Since(start), 100ms);
  ASSERT_FALSE(timed_out.ok());
  EXPECT_EQ(timed_out.status().code(), StatusCode::kTimeout);
  EXPECT_NE(timed_out.status().message().find("'" + missing_name + "'"), std::string::npos)
      << timed_out.status().message();

  auto not_found = reader.Get({"absent"}, 0ms);
  ASSERT_FALSE(not_found.ok());
  EXPECT_EQ(not_found.status().code(), StatusCode::kNotFound);
  EXPECT_NE(not_found.status().message().find("'" + missing_name + "'"), std::string::npos);
}

TEST(HashStoreTest, SetGetWaitAndTimeout) {
  HashStore store;
  ExerciseStore(store, store, "absent");
}

TEST_F(CoordinatorTest, CoordinatorStoreHasTheSameSemanticsAndPrefixesKeys) {
  auto a = Connect();
  auto b = Connect();
  ASSERT_TRUE(a && b);
  CoordinatorStore reader(a.get(), "gloo/");
  CoordinatorStore writer(b.get(), "gloo/");
  ExerciseStore(reader, writer, "gloo/absent");

  auto raw = a->Get({"gloo/k1"}, 0ms);
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  EXPECT_EQ(raw->at(0), "v1");
  auto unprefixed = a->Get({"k1"}, 0ms);
  EXPECT_FALSE(unprefixed.ok()) << "the prefix must be applied";
  CoordinatorStore other(a.get(), "nccl/");
  EXPECT_FALSE(other.Get({"k1"}, 0ms).ok()) << "prefixes must separate stores";
}

// ---- Malformed input on raw sockets ----

class MalformedInputTest : public CoordinatorTest {
 protected:
  // Sends `bytes` on a fresh connection and expects an error reply with
  // `code` whose text contains `needle`, then a closed connection. The
  // member registered on a good connection must stay, and the server must
  // keep serving.
  void ExpectRefused(const std::string& bytes, StatusCode code, const std::string& needle) {
    RawConnection raw(coordinator_->port());
    ASSERT_TRUE(raw.connected());
    raw.Send(bytes);
    auto reply = raw.ReadReply(3s);
    ASSERT_TRUE(reply.decoded) << "no decodable reply (eof " << reply.eof << ", timeout " << reply.timeout << ")";
    EXPECT_TRUE(reply.is_error);
    EXPECT_EQ(reply.code, static_cast<uint32_t>(code)) << reply.text;
    EXPECT_NE(reply.text.find(needle), std::string::npos) << reply.text;
    EXPECT_TRUE(raw.WaitForClose(3s)) << "the server must close a connection that sent a bad message";
    ExpectGoodClientUnaffected();
  }

  void ExpectGoodClientUnaffected() {
    if (!good_) {
      good_ = Join(Role::kWorker, 0);
      ASSERT_TRUE(good_);
    }
    auto map = good_->GetMap(false, 0ms);
    ASSERT_TRUE(map.ok()) << map.status().ToString();
    EXPECT_EQ(map->workers.size(), 1u);
    EXPECT_EQ(map->generation, 1u) << "nobody else joined or left";
    ExpectHealthy();
  }

  std::unique_ptr<CoordinatorClient> good_;
};

TEST_F(MalformedInputTest, HugeLengthPrefix) {
  ExpectGoodClientUnaffected();
  ExpectRefused(LengthPrefix(0xfffffff8u) + std::string(64, 'x'), StatusCode::kInvalidArgument,
                "exceeds the limit of 16777216 bytes");
}

TEST_F(MalformedInputTest, LengthNotAMultipleOfEight) {
  ExpectRefused(LengthPrefix(12) + std::string(12, 'x'), StatusCode::kCorruption, "not a multiple of 8");
}

TEST_F(MalformedInputTest, ZeroLength) {
  ExpectRefused(LengthPrefix(0), StatusCode::kInvalidArgument, "empty message");
}

TEST_F(MalformedInputTest, ValidLengthWithGarbage) {
  // A segment table announcing ~2.9e9 segments.
  ExpectRefused(LengthPrefix(64) + std::string(64, '\xab'), StatusCode::kCorruption, "does not decode");
  // A sound segment table (one segment of 7 words) followed by garbage
  // pointers.
  std::string body(8, '\0');
  body[4] = 7;
  body += std::string(56, '\xab');
  ExpectRefused(LengthPrefix(64) + body, StatusCode::kCorruption, "does not decode");
}

TEST_F(MalformedInputTest, EmptyUnion) {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<schema::CoordRequest>();
  request.setRequestId(77);  // union left at its default: register, with no body
  std::string frame = FrameOf(message);
  RawConnection raw(coordinator_->port());
  ASSERT_TRUE(raw.connected());
  raw.Send(frame);
  auto reply = raw.ReadReply(3s);
  ASSERT_TRUE(reply.decoded);
  EXPECT_TRUE(reply.is_error);
  EXPECT_EQ(reply.request_id, 77u) << "the refusal echoes the request id";
  EXPECT_EQ(reply.code, static_cast<uint32_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(reply.text.find("empty union"), std::string::npos) << reply.text;
  EXPECT_TRUE(raw.WaitForClose(3s));
  ExpectGoodClientUnaffected();
}

TEST_F(MalformedInputTest, TruncatedMessageThenClose) {
  ExpectGoodClientUnaffected();
  {
    RawConnection raw(coordinator_->port());
    ASSERT_TRUE(raw.connected());
    raw.Send(LengthPrefix(64) + std::string(10, '\0'));
    raw.ShutdownWrite();
    auto reply = raw.ReadReply(3s);
    EXPECT_TRUE(reply.eof) << "the server closes a connection that ends inside a message";
  }
  ExpectGoodClientUnaffected();
}

TEST_F(MalformedInputTest, RandomBytes) {
  ExpectGoodClientUnaffected();
  std::mt19937 rng(20240611);
  for (int trial = 0; trial < 16; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    std::string bytes(8 + rng() % 512, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    if (trial % 2 == 1) {
      // A plausible length, so the garbage reaches the decoder.
      const uint32_t length = static_cast<uint32_t>((bytes.size() - 4) / 8 * 8);
      bytes.replace(0, 4, LengthPrefix(length));
    }
    RawConnection raw(coordinator_->port());
    ASSERT_TRUE(raw.connected());
    raw.Send(bytes);
    raw.ShutdownWrite();
    // Either an error reply then a close, or a close.
    auto reply = raw.ReadReply(3s);
    ASSERT_FALSE(reply.timeout) << "the server neither replied nor closed";
    if (reply.decoded) {
      EXPECT_TRUE(reply.is_error);
      EXPECT_FALSE(reply.text.empty());
      EXPECT_TRUE(raw.WaitForClose(3s));
    } else {
      EXPECT_TRUE(reply.eof);
    }
  }
  ExpectGoodClientUnaffected();
}

// Black-box fuzzing over real sockets: mutated real requests (bit flips in
// valid CoordRequests of every kind). Each one gets a reply (an error, or a
// normal answer when the mutation left it valid) or a close, never a hang,
// and the registered member and a fresh client are unaffected.
TEST_F(MalformedInputTest, MutatedRealRequestsNeverStopTheCoordinator) {
  ExpectGoodClientUnaffected();
  std::vector<std::string> seeds;
  for (int which = 0; which < 5; ++which) {
    capnp::MallocMessageBuilder builder;
    auto r = builder.initRoot<schema::CoordRequest>();
    r.setRequestId(100 + which);
    if (which == 0) {
      auto get = r.initGetMap();
      get.setWaitComplete(false);
    } else if (which == 1) {
      auto set = r.initKvSet();
      set.setKey("fuzz");
      set.setValue(kj::arrayPtr(reinterpret_cast<const kj::byte*>("value"), 5));
    } else if (which == 2) {
      auto keys = r.initKvGet().initKeys(2);
      keys.set(0, "fuzz");
      keys.set(1, "health");
    } else if (which == 3) {
      auto barrier = r.initBarrier();
      barrier.setName("fuzz-barrier");
      barrier.setCount(1);
    } else {
      r.setHeartbeat();
    }
    seeds.push_back(FrameOf(builder));
  }
  std::mt19937 rng(20261130);
  for (int trial = 0; trial < 300; ++trial) {
    std::string bytes = seeds[rng() % seeds.size()];
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      // Past the length prefix: the decoder, not the framing, is the target.
      const size_t at = 4 + rng() % (bytes.size() - 4);
      bytes[at] = static_cast<char>(bytes[at] ^ (1 << (rng() % 8)));
    }
    RawConnection raw(coordinator_->port());
    ASSERT_TRUE(raw.connected());
    raw.Send(bytes);
    raw.ShutdownWrite();
    auto reply = raw.ReadReply(3s);
    ASSERT_FALSE(reply.timeout) << "trial " << trial << ": neither a reply nor a close";
  }
  ExpectGoodClientUnaffected();
}

// ---- Resource limits (issue: 300 idle connections exhausted descriptors,
// 32 length prefixes of 16 MiB held 518 MiB, and nothing timed out) ----

std::unique_ptr<Coordinator> StartWith(CoordinatorOptions options) {
  options.port = 0;
  auto started = Coordinator::Start(options);
  EXPECT_TRUE(started.ok()) << started.status().ToString();
  return started.ok() ? std::move(started).value() : nullptr;
}

void ExpectServes(Coordinator& coordinator) {
  auto client = CoordinatorClient::Connect("127.0.0.1", coordinator.port(), 5s);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_TRUE((*client)->Heartbeat().ok());
  ASSERT_TRUE((*client)->Set("k", "v").ok());
  auto got = (*client)->Get({"k"}, 0ms);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->at(0), "v");
}

TEST(CoordinatorLimitsTest, ConnectionsBeyondTheCapAreRefused) {
  CoordinatorOptions options;
  options.max_connections = 4;
  auto coordinator = StartWith(options);
  ASSERT_TRUE(coordinator);
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(std::make_unique<RawConnection>(coordinator->port()));
    ASSERT_TRUE(idle.back()->connected());
  }
  std::this_thread::sleep_for(100ms);  // let the server accept them
  RawConnection extra(coordinator->port());
  auto reply = extra.ReadReply(3s);
  ASSERT_TRUE(reply.decoded) << "eof " << reply.eof << ", timeout " << reply.timeout;
  EXPECT_TRUE(reply.is_error);
  EXPECT_NE(reply.text.find("too many connections"), std::string::npos) << reply.text;
  EXPECT_NE(reply.text.find("at most 4"), std::string::npos) << reply.text;
  EXPECT_TRUE(extra.WaitForClose(3s));
  idle.clear();
  std::this_thread::sleep_for(100ms);
  ExpectServes(*coordinator);
}

TEST(CoordinatorLimitsTest, StalledMessagesAndSilentConnectionsTimeOut) {
  CoordinatorOptions options;
  options.read_timeout = 300ms;
  auto coordinator = StartWith(options);
  ASSERT_TRUE(coordinator);
  RawConnection stalled(coordinator->port());
  stalled.Send(LengthPrefix(1u << 20) + std::string(64, 'x'));  // announces 1 MiB, sends 64 B
  RawConnection silent(coordinator->port());                    // sends nothing at all
  for (RawConnection* raw : {&stalled, &silent}) {
    auto reply = raw->ReadReply(5s);
    ASSERT_TRUE(reply.decoded) << "eof " << reply.eof << ", timeout " << reply.timeout;
    EXPECT_EQ(reply.code, static_cast<uint32_t>(StatusCode::kTimeout)) << reply.text;
    EXPECT_NE(reply.text.find("read_timeout"), std::string::npos) << reply.text;
    EXPECT_TRUE(raw->WaitForClose(3s));
  }
  ExpectServes(*coordinator);
}

TEST(CoordinatorLimitsTest, PartialMessagesShareABoundedBudget) {
  CoordinatorOptions options;
  options.max_pending_bytes = 1 << 20;
  auto coordinator = StartWith(options);
  ASSERT_TRUE(coordinator);
  // Each announces the largest allowed message and sends 600 KiB of it: the
  // second would take the unfinished bytes past 1 MiB.
  RawConnection a(coordinator->port()), b(coordinator->port());
  const std::string part = LengthPrefix(16u << 20) + std::string(600 << 10, 'x');
  a.Send(part);
  std::this_thread::sleep_for(200ms);
  b.Send(part);
  auto reply = b.ReadReply(5s);
  ASSERT_TRUE(reply.decoded) << "eof " << reply.eof << ", timeout " << reply.timeout;
  EXPECT_NE(reply.text.find("max_pending_bytes"), std::string::npos) << reply.text;
  EXPECT_TRUE(b.WaitForClose(3s));
  ExpectServes(*coordinator);
}

TEST_F(CoordinatorTest, BarrierWaiterWhoseConnectionClosesIsRemoved) {
  {
    capnp::MallocMessageBuilder message;
    auto request = message.initRoot<schema::CoordRequest>();
    request.setRequestId(1);
    auto barrier = request.initBarrier();
    barrier.setName("pair");
    barrier.setCount(2);
    barrier.setTimeoutMs(10000);
    barrier.setMember("ghost");
    RawConnection raw(coordinator_->port());
    ASSERT_TRUE(raw.connected());
    ASSERT_TRUE(raw.Send(FrameOf(message)));
    auto reply = raw.ReadReply(100ms);
    EXPECT_TRUE(reply.timeout) << "one of two arrived: the barrier must wait";
  }  // closes: the ghost leaves the barrier
  std::this_thread::sleep_for(100ms);
  auto client = Connect();
  ASSERT_TRUE(client);
  Status alone = client->Barrier("pair", 2, "real", 300ms);
  ASSERT_FALSE(alone.ok()) << "the closed connection must not count as arrived";
  EXPECT_EQ(alone.code(), StatusCode::kTimeout);
  EXPECT_NE(alone.message().find("1 of 2 arrived (real)"), std::string::npos) << alone.message();
  EXPECT_EQ(alone.message().find("ghost"), std::string::npos) << alone.message();
}

TEST(CoordinatorClientTest, ConnectToNothingFailsWithinTheTimeoutNamingTheAddress) {
  const uint16_t port = UnusedPort();
  const auto start = Clock::now();
  auto client = CoordinatorClient::Connect("127.0.0.1", port, 400ms);
  const auto took = Since(start);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kIOError);
  EXPECT_NE(client.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << client.status().message();
  EXPECT_GE(took, 250ms) << "Connect retries until the timeout";
  EXPECT_LT(took, 1500ms);
}

// ---- The real binary ----

std::string CoordinatorBinary() {
  const char* dir = std::getenv("GRIDSYNC_BUILD_DIR");
  return std::string(dir && *dir ? dir : "build") + "/server/gridsync-coordinator";
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "coordinator_test.XXXXXX").string();
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

  Child missing({CoordinatorBinary(), "--config", dir_.path() + "/no-such.json"}, dir_.path() + "/missing.log");
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
  while (ReadFile(log).find(left) == std::string::npos && Since(start) < 3s) std::this_thread::sleep_for(20ms);
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
    auto reg = (*worker)->Register(info, 2s);
    ASSERT_TRUE(reg.ok()) << reg.status().ToString();
    ASSERT_TRUE((*worker)->Barrier("done", 1, "worker-0", 2s).ok());
  }
  const std::string ended = "[info] worker 0 left after the job ended (node 'node-y'";
  const auto again = Clock::now();
  while (ReadFile(log).find(ended) == std::string::npos && Since(again) < 3s)
    std::this_thread::sleep_for(20ms);
  EXPECT_NE(ReadFile(log).find(ended), std::string::npos) << ReadFile(log);

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
  const std::string ready = socket.Next(5s);
  EXPECT_EQ(ready.rfind("READY=1", 0), 0u) << "first message: '" << ready << "'\n"
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
