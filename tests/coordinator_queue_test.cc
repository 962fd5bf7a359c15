// The coordinator against requests queued behind a waiting one, and
// barriers: what they hold stays within the pending budget, strangers
// queue nothing, barriers nobody waits on are forgotten, and a client's
// own timeouts bound its calls.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/coordinator_limits_util.h"

namespace gridsync {
namespace {

// ---- Requests queued behind a waiting one, and barriers (review: two
// connections each holding a barrier queued 64 kvSets of 15 MB, 1.93 GB;
// 2000 count-1 barriers of unique 1 MB names were kept forever, 2.45 GB) ----

TEST(CoordinatorLimitsTest, RequestsQueuedBehindAWaitingOneShareTheBudget) {
  CoordinatorOptions options;
  options.max_pending_bytes = 2 << 20;  // a connection may queue 512 KiB
  options.expected_shards = 1;
  options.expected_workers = 8;
  auto coordinator = StartWith(options);
  ASSERT_TRUE(coordinator);
  constexpr size_t kValue = 240 << 10;
  // One member waits at a barrier and queues two kvSets behind it: held,
  // and counted. (A stranger may queue nothing: see below.)
  auto registered = RegisteredWorker(coordinator->port(), 0);
  RawConnection& a = *registered;
  ASSERT_TRUE(a.Send(BarrierFrame(1, "hold-a", 2, 10000)));
  ASSERT_TRUE(a.Send(KvSetFrame(2, "a2", kValue) + KvSetFrame(3, "a3", kValue)));
  auto held = StatsOnce(*coordinator, [](const auto& s) { return s.queued_requests == 2; });
  EXPECT_EQ(held.queued_requests, 2u);
  EXPECT_GT(held.queued_bytes, 2 * kValue);
  EXPECT_LE(held.queued_bytes, options.max_pending_bytes / 4);
  EXPECT_TRUE(a.ReadReply(50ms).timeout) << "the barrier waits, and the kvSets behind it";
  // A third would take its queue past a quarter of the budget: refused,
  // naming both bounds, and the connection closed with its queue.
  ASSERT_TRUE(a.Send(KvSetFrame(4, "a4", kValue)));
  auto refused = a.ReadReply(3s);
  ASSERT_TRUE(refused.decoded) << "eof " << refused.eof << ", timeout " << refused.timeout;
  EXPECT_EQ(refused.request_id, 4u);
  EXPECT_EQ(refused.code, static_cast<uint32_t>(StatusCode::kInvalidArgument)) << refused.text;
  EXPECT_NE(refused.text.find("allowed: at most 524288 bytes queued per connection"),
            std::string::npos)
      << refused.text;
  EXPECT_NE(refused.text.find("2097152 in all (max_pending_bytes)"), std::string::npos)
      << refused.text;
  EXPECT_TRUE(a.WaitForClose(3s));
  auto freed = StatsOnce(*coordinator, [](const auto& s) { return s.queued_bytes == 0; });
  EXPECT_EQ(freed.queued_bytes, 0u);
  EXPECT_EQ(freed.queued_requests, 0u);
  EXPECT_EQ(freed.barriers, 0u) << "its barrier left with it";

  // Four connections each within their share hold most of the budget
  // together; a fifth past it is refused, and the four keep waiting.
  std::vector<std::unique_ptr<RawConnection>> holders;
  for (int c = 0; c < 4; ++c) {
    holders.push_back(RegisteredWorker(coordinator->port(), c + 1));
    const std::string n = std::to_string(c);
    ASSERT_TRUE(holders.back()->Send(BarrierFrame(1, "hold-" + n, 2, 10000) +
                                     KvSetFrame(2, n + "/2", kValue) +
                                     KvSetFrame(3, n + "/3", kValue)));
  }
  held = StatsOnce(*coordinator, [](const auto& s) { return s.queued_requests == 8; });
  EXPECT_EQ(held.queued_requests, 8u);
  EXPECT_LE(held.queued_bytes + held.pending_bytes, options.max_pending_bytes);
  auto fifth_connection = RegisteredWorker(coordinator->port(), 5);
  RawConnection& fifth = *fifth_connection;
  ASSERT_TRUE(fifth.Send(BarrierFrame(1, "hold-5", 2, 10000) + KvSetFrame(2, "5/2", kValue)));
  refused = fifth.ReadReply(3s);
  ASSERT_TRUE(refused.decoded) << "eof " << refused.eof << ", timeout " << refused.timeout;
  EXPECT_NE(refused.text.find("max_pending_bytes"), std::string::npos) << refused.text;
  EXPECT_TRUE(fifth.WaitForClose(3s));
  // A good client still gets small requests through.
  ExpectServes(*coordinator);
  held = StatsOnce(*coordinator, [](const auto& s) { return s.barrier_waiting == 4; });
  EXPECT_EQ(held.barrier_waiting, 4u);
  EXPECT_EQ(held.queued_requests, 8u);
  holders.clear();
  freed = StatsOnce(*coordinator, [](const auto& s) { return s.queued_bytes == 0; });
  EXPECT_EQ(freed.queued_bytes, 0u);
  EXPECT_EQ(freed.barriers, 0u);
}

// A review: four connections that never registered, each waiting at a
// barrier of its own with a quarter of the budget queued behind it, held
// all of it, and every member's next message was refused. A stranger
// queues nothing: a second request while its first waits is refused, and
// the members are served.
TEST(CoordinatorLimitsTest, StrangersQueueNothingBehindAWaitingRequest) {
  auto coordinator = StartWith(TwoMiBBudget());
  ASSERT_TRUE(coordinator);
  auto member = RegisteredMember(*coordinator);
  ASSERT_TRUE(member.ok()) << member.status().ToString();
  std::vector<std::unique_ptr<RawConnection>> strangers;
  for (int c = 0; c < 4; ++c) {
    strangers.push_back(std::make_unique<RawConnection>(coordinator->port()));
    const std::string n = std::to_string(c);
    ASSERT_TRUE(strangers.back()->Send(BarrierFrame(1, "wait-" + n, 2, 10000) +
                                       KvSetFrame(2, "s" + n, 400 << 10)));
    auto refused = strangers.back()->ReadReply(3s);
    ASSERT_TRUE(refused.decoded) << "eof " << refused.eof << ", timeout " << refused.timeout;
    EXPECT_EQ(refused.request_id, 2u);
    EXPECT_NE(refused.text.find("one request at a time until it registers"), std::string::npos)
        << refused.text;
  }
  const auto stats = coordinator->stats(2s);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->queued_bytes, 0u);
  const std::string value(700 << 10, 'm');
  EXPECT_TRUE((*member)->Set("member/big", value).ok());
  EXPECT_TRUE((*member)->Heartbeat().ok());
}

TEST(CoordinatorLimitsTest, BarriersAreForgottenOnceNobodyWaits) {
  CoordinatorOptions options;
  options.max_barriers = 4;
  auto coordinator = StartWith(options);
  ASSERT_TRUE(coordinator);
  auto client = CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 5s);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  // Many more completed names than max_barriers: each is forgotten.
  for (int i = 0; i < 100; ++i) {
    const std::string name = "once-" + std::to_string(i) + std::string(1000, 'n');
    ASSERT_TRUE((*client)->Barrier(name, 1, "", 2s).ok()) << i;
  }
  auto stats = StatsOnce(*coordinator, [](const auto&) { return true; });
  EXPECT_EQ(stats.barriers, 0u);
  EXPECT_EQ(stats.barriers_passed, 100u);
  // A round of two completes and is forgotten; the name then starts a new
  // round that waits again (and times out alone, and is forgotten).
  auto other = CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 5s);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  Status first;
  std::thread t([&] { first = (*other)->Barrier("pair", 2, "w1", 3s); });
  EXPECT_TRUE((*client)->Barrier("pair", 2, "w0", 3s).ok());
  t.join();
  EXPECT_TRUE(first.ok()) << first.ToString();
  EXPECT_EQ(StatsOnce(*coordinator, [](const auto&) { return true; }).barriers, 0u);
  Status alone = (*client)->Barrier("pair", 2, "w0", 200ms);
  EXPECT_EQ(alone.code(), StatusCode::kTimeout) << alone.ToString();
  EXPECT_NE(alone.message().find("barrier 'pair' timed out after 0.2 s: 1 of 2 arrived (w0)"),
            std::string::npos)
      << alone.message();
  EXPECT_EQ(StatsOnce(*coordinator, [](const auto&) { return true; }).barriers, 0u);
  // A waiter whose connection closes takes its barrier with it.
  {
    RawConnection raw(coordinator->port());
    ASSERT_TRUE(raw.Send(BarrierFrame(1, "ghost", 2, 10000)));
    EXPECT_EQ(StatsOnce(*coordinator, [](const auto& s) { return s.barriers == 1; }).barriers, 1u);
  }
  EXPECT_EQ(StatsOnce(*coordinator, [](const auto& s) { return s.barriers == 0; }).barriers, 0u);
  ExpectServes(*coordinator);
}

TEST(CoordinatorLimitsTest, BarrierNamesAndLiveBarriersAreBounded) {
  CoordinatorOptions options;
  options.max_barriers = 2;
  auto coordinator = StartWith(options);
  ASSERT_TRUE(coordinator);
  auto client = CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 5s);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_TRUE((*client)->Barrier(std::string(1024, 'n'), 1, "", 2s).ok()) << "at the limit";
  // (64 KiB: a connection that has not registered sends at most 1 MiB.)
  Status long_name = (*client)->Barrier(std::string(1 << 16, 'n'), 1, "", 2s);
  EXPECT_EQ(long_name.code(), StatusCode::kInvalidArgument) << long_name.ToString();
  EXPECT_NE(long_name.message().find(
                "name of 65536 bytes; allowed: 1 to 1024 bytes (max_barrier_name_bytes)"),
            std::string::npos)
      << long_name.message().substr(0, 400);
  EXPECT_LT(long_name.message().size(), 1024u) << "the name is not echoed whole";
  Status long_member = (*client)->Barrier("b", 1, std::string(1025, 'm'), 2s);
  EXPECT_NE(long_member.message().find("member name of 1025 bytes; allowed: at most 1024 bytes"),
            std::string::npos)
      << long_member.message().substr(0, 400);
  // Two barriers with members waiting: a third name is refused until one
  // of them completes; its members wait on.
  RawConnection a(coordinator->port()), b(coordinator->port());
  ASSERT_TRUE(a.Send(BarrierFrame(1, "a", 2, 10000)));
  ASSERT_TRUE(b.Send(BarrierFrame(1, "b", 2, 10000)));
  ASSERT_EQ(StatsOnce(*coordinator, [](const auto& s) { return s.barriers == 2; }).barriers, 2u);
  Status third = (*client)->Barrier("c", 1, "", 2s);
  EXPECT_EQ(third.code(), StatusCode::kInvalidArgument) << third.ToString();
  EXPECT_NE(third.message().find("2 barriers already have members waiting; allowed: at most 2 at "
                                 "once (max_barriers)"),
            std::string::npos)
      << third.message();
  EXPECT_TRUE((*client)->Barrier("a", 2, "", 2s).ok()) << "joining a live one is fine";
  auto passed = a.ReadReply(3s);
  ASSERT_TRUE(passed.decoded);
  EXPECT_FALSE(passed.is_error) << passed.text;
  EXPECT_TRUE((*client)->Barrier("c", 1, "", 2s).ok()) << "'a' completed: room again";
  EXPECT_TRUE((*client)->Heartbeat().ok());
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
  // Unavailable: a worker that never reached its coordinator exits 4 on it.
  EXPECT_EQ(client.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(client.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << client.status().message();
  EXPECT_GE(took, 250ms) << "Connect retries until the timeout";
  EXPECT_LT(took, 1500ms);
}

// A peer that accepts and never answers (a probe's hung listener) is named
// within the reply timeout a client sets (gridsync monitor --timeout), not
// the default 10 s.
// A hostile probe: connections that never registered nor proved a key,
// each holding 1 MiB of a message they never finish, filled the strangers'
// share, and every worker's registration (and `gridsync monitor`) was
// refused until read_timeout; reconnecting kept it so. The stranger holding
// the most is now closed to make room for a newcomer's message.
TEST(CoordinatorLimitsTest, StrangersHoldingTheirShareCannotLockNewMembersOut) {
  CoordinatorOptions options;
  options.max_pending_bytes = 8 << 20;  // strangers' share: 4 MiB
  options.expected_shards = 1;
  options.expected_workers = 2;
  auto coordinator = StartWith(options);
  ASSERT_TRUE(coordinator);
  std::vector<std::unique_ptr<RawConnection>> holders;
  const std::string held = LengthPrefix(1u << 20) + std::string((1u << 20) - 8, 'x');
  for (int c = 0; c < 6; ++c) {
    holders.push_back(std::make_unique<RawConnection>(coordinator->port()));
    holders.back()->Send(held);
    // Each holder's bytes all read before the next connects: four fill the
    // share, and each later one closes the oldest of them. Past four the
    // total alone cannot tell (it is full before the holder's first read
    // and again after its last), so the oldest's reply is read first: two
    // holders read at once would tie at their last chunks, and the reader
    // is refused on a tie.
    if (c >= 4) {
      auto reply = holders[c - 4]->ReadReply(3000ms);
      ASSERT_TRUE(reply.decoded) << "holder " << c - 4 << " was not closed for holder " << c;
      EXPECT_NE(reply.text.find("closed to make room"), std::string::npos) << reply.text;
    }
    const uint64_t full = uint64_t(std::min(c + 1, 4)) << 20;
    const auto stats = StatsOnce(
        *coordinator, [full](const CoordinatorStats& s) { return s.pending_bytes == full; });
    ASSERT_EQ(stats.pending_bytes, full) << "holder " << c;
  }
  // The share is full: the first two were closed for the last two (above),
  // and the others are still held.
  for (int c = 2; c < 6; ++c) {
    auto reply = holders[c]->ReadReply(100ms);
    EXPECT_FALSE(reply.decoded) << "holder " << c << ": " << reply.text;
  }
  // Two workers register, one after the other, and are served.
  for (int rank = 0; rank < 2; ++rank) {
    auto worker = CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 5s);
    ASSERT_TRUE(worker.ok()) << worker.status().ToString();
    auto registered = (*worker)->Register(Member(Role::kWorker, rank), 2s);
    ASSERT_TRUE(registered.ok()) << "rank " << rank << ": " << registered.status().ToString();
    EXPECT_TRUE((*worker)->Heartbeat().ok());
  }
  // The oldest holder left, the third, made room for the first.
  auto reply = holders[2]->ReadReply(3s);
  ASSERT_TRUE(reply.decoded) << "a member registered without any holder making room";
  EXPECT_NE(reply.text.find("closed to make room"), std::string::npos) << reply.text;
}

TEST(CoordinatorClientTest, ASetReplyTimeoutBoundsACallThatWaitsOnNothing) {
  uint16_t port = 0;
  const int listener = testing::ListenOnLoopback(&port);  // the kernel accepts; nobody answers
  ASSERT_GE(listener, 0);
  auto client = CoordinatorClient::Connect("127.0.0.1", port, 2s);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  (*client)->SetReplyTimeout(300ms);
  const auto start = Clock::now();
  auto map = (*client)->GetMap(false, 0ms);
  const auto took = Since(start);
  ASSERT_FALSE(map.ok());
  EXPECT_EQ(map.status().code(), StatusCode::kTimeout) << map.status().ToString();
  EXPECT_NE(map.status().message().find("within 0.3 s"), std::string::npos)
      << map.status().ToString();
  EXPECT_LT(took, 3s);
  ::close(listener);
}

// A review: replies queued to a stranger that never reads were bounded per
// connection only (64 MiB past which reading pauses, plus the reply that
// crossed it): a kvGet of 64 MiB twice held 128 MiB a connection, and 512
// connections could hold 64 GiB. Strangers' queued replies now share half
// the pending budget; the one holding the most is closed.
TEST(CoordinatorLimitsTest, RepliesStrangersDoNotReadShareABoundedBudget) {
  auto coordinator = StartWith(TwoMiBBudget());  // strangers' share: 1 MiB
  ASSERT_TRUE(coordinator);
  auto member = RegisteredMember(*coordinator);
  ASSERT_TRUE(member.ok()) << member.status().ToString();
  ASSERT_TRUE((*member)->Set("big", std::string(400 << 10, 'x')).ok());
  auto open_now = [&] {
    auto stats = coordinator->stats(2s);
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    return stats.ok() ? stats->connections : 0;
  };
  const uint64_t before = open_now();  // the member's
  RawConnection greedy(coordinator->port());
  ASSERT_TRUE(greedy.connected());
  for (const auto until = Clock::now() + 5s; open_now() == before && Clock::now() < until;)
    std::this_thread::sleep_for(10ms);  // accepted
  ASSERT_EQ(open_now(), before + 1);
  for (uint64_t id = 1; id <= 40; ++id) {               // 16 MB of replies, none read
    if (!greedy.Send(KvGetFrame(id, "big", 0))) break;  // closed already
  }
  // Closed by the coordinator (not read here: the replies the kernel took
  // would take long to read a byte at a time).
  bool closed = false;
  for (const auto until = Clock::now() + 10s; !closed && Clock::now() < until;) {
    closed = open_now() == before;
    if (!closed) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(closed) << "a stranger that does not read kept its replies";
  // A stranger that reads (a monitor) and the member are served.
  ExpectServes(*coordinator);
  auto got = (*member)->Get({"big"}, 0ms);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->at(0).size(), size_t{400 << 10});
}

}  // namespace
}  // namespace gridsync
