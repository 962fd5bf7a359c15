// The control plane's waits: a wait for the whole cluster map and
// barriers, each returning when the last member arrives or timing out
// naming who is missing and, where it said so, why it could not join.
// (Registration, the store and the Store seam: coordinator_test.cc.)
#include "tests/coordinator_test_util.h"

namespace gridsync {
namespace {

// The fixture lives in an anonymous namespace of the header, so each file
// names its own suite.
class CoordinatorWaitsTest : public CoordinatorTest {};

TEST_F(CoordinatorWaitsTest, WaitCompleteReturnsWhenTheLastMemberJoins) {
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

TEST_F(CoordinatorWaitsTest, WaitCompleteTimesOutNamingMissingRanks) {
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
  EXPECT_NE(map.status().message().find(
                "cluster incomplete after 0.3 s: missing shards [1], workers [0, 2]"),
            std::string::npos)
      << map.status().message();
  EXPECT_GE(waited, 250ms);
  EXPECT_LT(waited, 2s);
  // The connection stays usable after a server-side timeout.
  EXPECT_TRUE(observer->Heartbeat().ok());
}

// A shard that refused another run's checkpoint files exits 3 before it
// registers: the others' wait named only "missing shards [1]" (a hostile
// probe). What it said on its way out, or its refused registration, is
// named beside the rank until that rank registers.
TEST_F(CoordinatorWaitsTest, AMissingRankThatSaidWhyItCannotJoinIsNamed) {
  auto shard = Join(Role::kShard, 0);
  auto worker = Join(Role::kWorker, 1);
  auto stranger = Connect();
  ASSERT_TRUE(shard && worker && stranger);
  ReportCannotJoin(*stranger, Role::kShard, 1,
                   Status::CheckpointsHeld("its files of step 150 are another run's"));

  // Only a rank the cluster expects, of a shard or worker, by a member
  // itself or a connection that did not register as another.
  const Status others = worker->Set(CannotJoinKey(Role::kShard, 1), "forged");
  EXPECT_EQ(others.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(others.message().find("registered as worker 1"), std::string::npos)
      << others.ToString();
  for (const std::string key : {"cannot-join/shard/2", "cannot-join/observer/0",
                                "cannot-join/shard/", "cannot-join/shard/1x"}) {
    const Status bad = stranger->Set(key, "x");
    EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << key;
    EXPECT_NE(bad.message().find("allowed: 'cannot-join/<shard|worker>/<rank>' of a rank the "
                                 "cluster expects (shards 0..1, workers 0..2)"),
              std::string::npos)
        << bad.ToString();
  }
  EXPECT_EQ(stranger->Set(CannotJoinKey(Role::kWorker, 0), std::string(1025, 'x')).code(),
            StatusCode::kInvalidArgument);

  auto map = stranger->GetMap(true, 300ms);
  ASSERT_FALSE(map.ok());
  EXPECT_EQ(map.status().code(), StatusCode::kTimeout);
  EXPECT_NE(map.status().message().find(
                "missing shards [1], workers [0, 2] (expecting 2 shards, 3 workers); shard 1 could "
                "not join: CheckpointsHeld: its files of step 150 are another run's"),
            std::string::npos)
      << map.status().message();
  // A barrier's timeout names it too, where the rank is missing there.
  const Status barrier = shard->Barrier("sync", 2, "shard-0", 300ms);
  EXPECT_NE(barrier.message().find("shard 1 could not join: CheckpointsHeld"), std::string::npos)
      << barrier.ToString();

  // A refused registration of a missing rank is named as well; "already
  // taken" says nothing of a missing rank and is not.
  auto late = Connect();
  ASSERT_TRUE(late);
  ASSERT_FALSE(late->Register(Member(Role::kWorker, 1), 2s).ok());  // taken
  RegisterInfo rejoining = Member(Role::kWorker, 0);
  rejoining.rejoin_step = 100;  // training has not started
  ASSERT_FALSE(late->Register(rejoining, 2s).ok());
  map = stranger->GetMap(true, 300ms);
  ASSERT_FALSE(map.ok());
  EXPECT_NE(map.status().message().find("worker 0 could not join: its registration was refused: "
                                        "InvalidArgument: worker 0 asked to rejoin job 1"),
            std::string::npos)
      << map.status().message();
  EXPECT_EQ(map.status().message().find("worker 1 could not join"), std::string::npos)
      << map.status().message();
  // A registered rank's reason is its own: another connection's is refused,
  // and so is a spelling the coordinator never reads.
  const Status forged = stranger->Set(CannotJoinKey(Role::kWorker, 1), "forged");
  EXPECT_NE(forged.message().find("worker 1 is registered"), std::string::npos)
      << forged.ToString();
  EXPECT_NE(stranger->Set("cannot-join/shard/01", "x").message().find("own spelling"),
            std::string::npos);

  // The coordinator's own reason over a stranger's leaves the strangers'
  // share right: it wrapped once the rank registered and took the key,
  // refusing every later stranger's write.
  RegisterInfo shard_rejoin = Member(Role::kShard, 1);
  shard_rejoin.rejoin_step = 100;
  ASSERT_FALSE(late->Register(shard_rejoin, 2s).ok());

  // Registered, the rank is no longer missing and its reason goes.
  auto back = Join(Role::kShard, 1);
  ASSERT_TRUE(back);
  auto gone = stranger->Get({CannotJoinKey(Role::kShard, 1)}, 0ms);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  const Status after = stranger->Set("after", "fine");
  EXPECT_TRUE(after.ok()) << after.ToString();
}

TEST_F(CoordinatorWaitsTest, BarrierWithThreeThreadsCompletesAndIsReusable) {
  constexpr int kMembers = 3;
  constexpr int kRounds = 2;
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  for (int i = 0; i < kMembers; ++i) {
    clients.push_back(Connect());
    ASSERT_TRUE(clients.back());
  }
  std::vector<std::vector<Status>> statuses(kMembers, std::vector<Status>(kRounds));
  std::vector<std::vector<std::chrono::milliseconds>> waited(
      kMembers, std::vector<std::chrono::milliseconds>(kRounds));
  std::vector<std::thread> threads;
  for (int i = 0; i < kMembers; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < kRounds; ++round) {
        if (i == kMembers - 1) std::this_thread::sleep_for(200ms);  // the late one
        const auto start = Clock::now();
        statuses[i][round] =
            clients[i]->Barrier("step", kMembers, "worker-" + std::to_string(i), 5s);
        waited[i][round] = Since(start);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kMembers; ++i) {
    for (int round = 0; round < kRounds; ++round) {
      EXPECT_TRUE(statuses[i][round].ok())
          << "member " << i << " round " << round << ": " << statuses[i][round].ToString();
      if (i < kMembers - 1) {
        // Every round waits for the late member again: a completed barrier
        // does not let the next round through.
        EXPECT_GE(waited[i][round], 120ms) << "member " << i << " round " << round;
      }
    }
  }
}

TEST_F(CoordinatorWaitsTest, BarrierTimeoutNamesTheMissingMember) {
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
  EXPECT_NE(s1.message().find(
                "barrier 'init' timed out after 0.3 s: 2 of 3 arrived (worker-0, worker-1); "
                "missing: worker-2"),
            std::string::npos)
      << s1.message();
  // worker-1 gave up, so it is missing too by the time worker-0 gives up.
  EXPECT_NE(s0.message().find("barrier 'init' timed out after 0.7 s: 1 of 3 arrived (worker-0); "
                              "missing: worker-1, worker-2"),
            std::string::npos)
      << s0.message();
}

// `count` kvGet requests of key "big" (ids 1..count), sent in one go.
std::string KvGetsOfBig(uint64_t count) {
  std::string frames;
  for (uint64_t id = 1; id <= count; ++id) {
    capnp::MallocMessageBuilder message;
    auto request = message.initRoot<schema::CoordRequest>();
    request.setRequestId(id);
    request.initKvGet().initKeys(1).set(0, "big");
    frames += FrameOf(message);
  }
  return frames;
}

// A barrier's release replies to every member at once, and the launcher
// that stops the coordinator got its reply first: closed at once, the
// other members' replies still queued were dropped (a hostile network
// probe: a node's launcher exited 1 for a job that had finished). The
// coordinator now half-closes and lingers at a stop: what it queued before
// reaches the peer. Here the queue is 32 MiB of kvGet replies, more than
// the kernel's buffers hold while the peer does not read.
TEST_F(CoordinatorWaitsTest, RepliesQueuedBeforeAStopStillReachThePeer) {
  auto writer = Join(Role::kWorker, 0);
  ASSERT_TRUE(writer);
  ASSERT_TRUE(writer->Set("big", std::string(512 << 10, 'x')).ok());
  RawConnection reader(coordinator_->port());
  ASSERT_TRUE(reader.connected());
  constexpr uint64_t kGets = 64;
  ASSERT_TRUE(reader.Send(KvGetsOfBig(kGets)));
  // Every request read and its reply queued, most of them still here.
  std::this_thread::sleep_for(500ms);
  std::thread stop([&] { coordinator_->Stop(); });
  uint64_t replies = 0;
  for (; replies < kGets; ++replies) {
    const auto reply = reader.ReadReply(5s);
    if (!reply.decoded) break;
    EXPECT_EQ(reply.request_id, replies + 1);
    EXPECT_FALSE(reply.is_error) << reply.text;
  }
  stop.join();
  EXPECT_EQ(replies, kGets) << "replies queued before the stop were dropped";
  EXPECT_TRUE(reader.WaitForClose(3s));
}

// A peer that never reads its replies holds a stop no longer than the
// stop's own bound (kStopLinger, 2 s): before it, the stop waited out the
// 5 s fallback.
TEST_F(CoordinatorWaitsTest, APeerThatDoesNotReadHoldsAStopTwoSecondsAtMost) {
  auto writer = Join(Role::kWorker, 0);
  ASSERT_TRUE(writer);
  ASSERT_TRUE(writer->Set("big", std::string(512 << 10, 'x')).ok());
  RawConnection reader(coordinator_->port());
  ASSERT_TRUE(reader.connected());
  ASSERT_TRUE(reader.Send(KvGetsOfBig(64)));
  std::this_thread::sleep_for(500ms);
  const auto start = Clock::now();
  coordinator_->Stop();
  const auto took = Since(start);
  EXPECT_GE(took, 1500ms) << "the reader's replies were not waited for";
  EXPECT_LT(took, 4000ms) << "the stop waited for a peer that does not read";
}

// With every peer reading (or gone), a stop ends at once, not at its bound.
TEST_F(CoordinatorWaitsTest, AStopWithPeersThatReadEndsAtOnce) {
  auto a = Join(Role::kWorker, 0);
  auto b = Join(Role::kShard, 0);
  ASSERT_TRUE(a && b);
  std::thread stop([&] {
    const auto start = Clock::now();
    coordinator_->Stop();
    EXPECT_LT(Since(start), 1500ms);
  });
  // The clients see EOF and close their ends, as gridsync's do.
  std::this_thread::sleep_for(100ms);
  a.reset();
  b.reset();
  stop.join();
}

}  // namespace
}  // namespace gridsync
