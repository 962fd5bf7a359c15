// The coordinator against hostile input: raw malformed and mutated bytes,
// too many connections, stalled and partial messages, waiters that go
// away, and a client connecting to nothing. Each is refused or timed out,
// naming it, and the coordinator keeps serving.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/coordinator_limits_util.h"

namespace gridsync {
namespace {

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
    ASSERT_TRUE(reply.decoded) << "no decodable reply (eof " << reply.eof << ", timeout "
                               << reply.timeout << ")";
    EXPECT_TRUE(reply.is_error);
    EXPECT_EQ(reply.code, static_cast<uint32_t>(code)) << reply.text;
    EXPECT_NE(reply.text.find(needle), std::string::npos) << reply.text;
    EXPECT_TRUE(raw.WaitForClose(3s))
        << "the server must close a connection that sent a bad message";
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
  ExpectRefused(LengthPrefix(12) + std::string(12, 'x'), StatusCode::kCorruption,
                "not a multiple of 8");
}

TEST_F(MalformedInputTest, ZeroLength) {
  ExpectRefused(LengthPrefix(0), StatusCode::kInvalidArgument, "empty message");
}

TEST_F(MalformedInputTest, ValidLengthWithGarbage) {
  // A segment table announcing ~2.9e9 segments.
  ExpectRefused(LengthPrefix(64) + std::string(64, '\xab'), StatusCode::kCorruption,
                "does not decode");
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

// A coordinator of one shard and `workers` workers that keeps at most
// `max_connections` connections open.
CoordinatorOptions CappedAt(uint32_t max_connections, uint32_t workers) {
  CoordinatorOptions options;
  options.max_connections = max_connections;
  options.expected_shards = 1;
  options.expected_workers = workers;
  return options;
}

// `n` connections that send nothing, accepted in this order.
std::vector<std::unique_ptr<RawConnection>> SilentConnections(uint16_t port, int n) {
  std::vector<std::unique_ptr<RawConnection>> silent;
  for (int i = 0; i < n; ++i) {
    silent.push_back(std::make_unique<RawConnection>(port));
    EXPECT_TRUE(silent.back()->connected());
    std::this_thread::sleep_for(20ms);
  }
  return silent;
}

// A hostile probe: connections that connect and stay silent filled
// max_connections, and every new member was refused until read_timeout
// closed them (30 s), wave after wave. A new connection now takes the slot
// of the stranger heard from longest ago.
TEST(CoordinatorLimitsTest, AFullCoordinatorClosesTheStrangerIdleLongest) {
  auto coordinator = StartWith(CappedAt(4, 1));
  ASSERT_TRUE(coordinator);
  auto idle = SilentConnections(coordinator->port(), 4);
  auto member = CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 5s);
  ASSERT_TRUE(member.ok()) << member.status().ToString();
  ASSERT_TRUE((*member)->Register(Member(Role::kWorker, 0), 2s).ok());
  auto evicted = idle[0]->ReadReply(3s);
  ASSERT_TRUE(evicted.decoded) << "eof " << evicted.eof << ", timeout " << evicted.timeout;
  EXPECT_EQ(evicted.code, static_cast<uint32_t>(StatusCode::kIOError)) << evicted.text;
  EXPECT_NE(evicted.text.find("closed to make room"), std::string::npos) << evicted.text;
  EXPECT_NE(evicted.text.find("at most 4 (max_connections)"), std::string::npos) << evicted.text;
  EXPECT_TRUE(idle[0]->WaitForClose(3s));
  // The others keep their slots: one that speaks is served.
  idle[1]->Send(KvSetFrame(5, "k", 3));
  auto served = idle[1]->ReadReply(3s);
  ASSERT_TRUE(served.decoded) << "eof " << served.eof << ", timeout " << served.timeout;
  EXPECT_FALSE(served.is_error) << served.text;
  EXPECT_TRUE((*member)->Heartbeat().ok());
}

// A hostile probe: a flood of silent connections evicted `gridsync
// monitor`, a stranger that speaks. Silent strangers go first now, and a
// stranger waiting for an answer (the multi-node launcher at its barrier)
// is never closed for room.
TEST(CoordinatorLimitsTest, SilentStrangersGoBeforeOnesThatSpeak) {
  auto coordinator = StartWith(CappedAt(4, 1));
  ASSERT_TRUE(coordinator);
  auto monitor = CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 5s);
  ASSERT_TRUE(monitor.ok()) << monitor.status().ToString();
  ASSERT_TRUE((*monitor)->Heartbeat().ok());
  // A stranger waiting up to 5 s for a key nobody sets yet.
  RawConnection waiting(coordinator->port());
  waiting.Send(KvGetFrame(9, "launch/done", 5000));
  std::this_thread::sleep_for(100ms);
  auto silent = SilentConnections(coordinator->port(), 12);
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE((*monitor)->Heartbeat().ok()) << "the stranger that speaks was closed";
  ASSERT_TRUE((*monitor)->Set("launch/done", "1").ok());
  auto answered = waiting.ReadReply(3s);
  ASSERT_TRUE(answered.decoded) << "eof " << answered.eof << ", timeout " << answered.timeout;
  EXPECT_FALSE(answered.is_error) << answered.text;
  // The silent ones made room for each other, the oldest first.
  auto evicted = silent[0]->ReadReply(3s);
  ASSERT_TRUE(evicted.decoded) << "eof " << evicted.eof << ", timeout " << evicted.timeout;
  EXPECT_NE(evicted.text.find("sent no whole message since it connected"), std::string::npos)
      << evicted.text;
}

// A hostile probe: 512 strangers each waiting on a key nobody sets, with
// a timeout of days, locked every member out ("too many connections ...
// all of them registered members or proven keys", which they were not).
// A newcomer now takes the slot of the waiting stranger that connected
// last. And (a second probe) a starting cluster's processes, silent for the
// milliseconds between connect and register, no longer close each other:
// the waiting strangers outnumber them, so they go first.
TEST(CoordinatorLimitsTest, WaitingStrangersMakeRoomForNewcomersNewestFirst) {
  auto coordinator = StartWith(CappedAt(4, 1));
  ASSERT_TRUE(coordinator);
  std::vector<std::unique_ptr<RawConnection>> waiting;
  for (int i = 0; i < 4; ++i) {
    waiting.push_back(std::make_unique<RawConnection>(coordinator->port()));
    waiting.back()->Send(KvGetFrame(9, "never-set", 4000000000u));
    std::this_thread::sleep_for(50ms);
  }
  RawConnection early(coordinator->port());  // a shard before its register
  std::this_thread::sleep_for(50ms);
  auto member = CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 5s);
  ASSERT_TRUE(member.ok()) << member.status().ToString();
  ASSERT_TRUE((*member)->Register(Member(Role::kWorker, 0), 2s).ok());
  for (int i : {3, 2}) {
    auto evicted = waiting[i]->ReadReply(3s);
    ASSERT_TRUE(evicted.decoded) << i << ": eof " << evicted.eof << ", timeout " << evicted.timeout;
    EXPECT_NE(evicted.text.find("closed to make room"), std::string::npos) << evicted.text;
    EXPECT_NE(evicted.text.find("connected last of those"), std::string::npos) << evicted.text;
  }
  early.Send(KvSetFrame(5, "early", 3));
  auto served = early.ReadReply(3s);
  ASSERT_TRUE(served.decoded) << "eof " << served.eof << ", timeout " << served.timeout;
  EXPECT_FALSE(served.is_error) << "the silent newcomer was closed: " << served.text;
  // The older ones still wait: their key set, they are answered.
  ASSERT_TRUE((*member)->Set("never-set", "1").ok());
  for (int i = 0; i < 2; ++i) {
    auto answered = waiting[i]->ReadReply(3s);
    ASSERT_TRUE(answered.decoded) << i << ": eof " << answered.eof;
    EXPECT_FALSE(answered.is_error) << i << ": " << answered.text;
  }
}

// A hostile probe: a stranger's "rates/<step>/<rank>" = "x" ended an
// adaptive-split run ("worker 0's rate is not a number"), and keys under
// collective/ hold the workers' Gloo addresses. Both are registered
// workers' to write now; anyone may still read them.
TEST(CoordinatorLimitsTest, OnlyRegisteredWorkersWriteTheWorkersKeys) {
  auto coordinator = StartWith(CappedAt(8, 1));
  ASSERT_TRUE(coordinator);
  auto stranger = CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 5s);
  ASSERT_TRUE(stranger.ok()) << stranger.status().ToString();
  for (const std::string& key :
       {std::string("rates/400/0"), std::string(kCollectiveStorePrefix) + "gloo/x/0"}) {
    const Status refused = (*stranger)->Set(key, "x");
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << key << ": " << refused.ToString();
    EXPECT_NE(refused.message().find("the job's workers' own, written by registered workers only; "
                                     "this connection is not registered"),
              std::string::npos)
        << refused.message();
  }
  auto worker = CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 5s);
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  ASSERT_TRUE((*worker)->Register(Member(Role::kWorker, 0), 2s).ok());
  ASSERT_TRUE((*worker)->Set("rates/400/0", "1.5").ok());
  auto read = (*stranger)->Get({"rates/400/0"}, 0ms);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->at(0), "1.5");
  EXPECT_TRUE((*stranger)->Set("launch/solo", "1").ok()) << "other keys stay open";
}

// A hostile probe: a stranger that waited at "init" under a name of its own
// let one worker through alone; the job wedged until timeout_s. The job's
// barriers are its registered workers' now.
TEST(CoordinatorLimitsTest, OnlyRegisteredWorkersJoinTheJobsBarriers) {
  auto coordinator = StartWith(CappedAt(8, 2));
  ASSERT_TRUE(coordinator);
  auto stranger = CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 5s);
  ASSERT_TRUE(stranger.ok()) << stranger.status().ToString();
  for (const char* name : {"init", "done"}) {
    const Status refused = (*stranger)->Barrier(name, 2, "intruder0", 1s);
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.ToString();
    EXPECT_NE(refused.message().find(std::string("barrier '") + name +
                                     "' is the job's, for its registered workers"),
              std::string::npos)
        << refused.message();
  }
  // Other names stay open to anyone (the multi-node launchers' barriers).
  EXPECT_TRUE((*stranger)->Barrier("launch/solo", 1, "node-a", 1s).ok());
  // A registered worker waits as itself, not in another worker's place.
  auto worker = CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 5s);
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  ASSERT_TRUE((*worker)->Register(Member(Role::kWorker, 0), 2s).ok());
  const Status squatted = (*worker)->Barrier("init", 2, "worker-1", 1s);
  EXPECT_EQ(squatted.code(), StatusCode::kInvalidArgument) << squatted.ToString();
  EXPECT_NE(squatted.message().find("this connection is registered as worker-0 and waits as "
                                    "'worker-1'; allowed: its own name, 'worker-0', or none"),
            std::string::npos)
      << squatted.message();
}

// When every open connection is a member, a new one is refused (the
// descriptors stay free), and nobody is closed for it.
TEST(CoordinatorLimitsTest, ConnectionsBeyondTheCapAreRefusedWhenAllAreMembers) {
  auto coordinator = StartWith(CappedAt(2, 2));
  ASSERT_TRUE(coordinator);
  std::vector<std::unique_ptr<CoordinatorClient>> members;
  for (int rank = 0; rank < 2; ++rank) {
    auto client = CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 5s);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    ASSERT_TRUE((*client)->Register(Member(Role::kWorker, rank), 2s).ok());
    members.push_back(std::move(client).value());
  }
  RawConnection extra(coordinator->port());
  auto reply = extra.ReadReply(3s);
  ASSERT_TRUE(reply.decoded) << "eof " << reply.eof << ", timeout " << reply.timeout;
  EXPECT_TRUE(reply.is_error);
  EXPECT_NE(reply.text.find("too many connections"), std::string::npos) << reply.text;
  EXPECT_NE(reply.text.find("at most 2"), std::string::npos) << reply.text;
  EXPECT_TRUE(extra.WaitForClose(3s));
  for (auto& m : members) EXPECT_TRUE(m->Heartbeat().ok());
  members.pop_back();
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

// Issue (review): kvGet named one 16 MiB value a thousand times, and the
// coordinator built a reply of ~16 GiB; kvSet grew the store without bound.
TEST(CoordinatorLimitsTest, TheStoreAndKvGetRepliesAreBounded) {
  CoordinatorOptions options;
  options.max_store_bytes = 1 << 20;
  options.max_store_keys = 4;
  options.max_reply_bytes = 256 << 10;
  auto coordinator = StartWith(options);
  ASSERT_TRUE(coordinator);
  ExpectServes(*coordinator);  // holds key "k"
  auto client = CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 5s);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE((*client)->Set("big", std::string(200 << 10, 'x')).ok());
  auto one = (*client)->Get({"big"}, 0ms);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->at(0).size(), size_t{200 << 10});
  // Twice the value is past the reply bound: refused, naming it.
  auto twice = (*client)->Get({"big", "big"}, 0ms);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("allowed: at most 262144 bytes in one reply"),
            std::string::npos)
      << twice.status().ToString();
  // So is the count of keys one kvGet lists (a 1 MiB request listed 131k
  // empty keys, each a string held by its waiter and scanned at every set).
  auto many = (*client)->Get(std::vector<std::string>(4097, "never-set"), 1000ms);
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.status().message().find("4097 keys in one request; allowed: at most 4096"),
            std::string::npos)
      << many.status().ToString();
  // A value that would take the store past 1 MiB is refused; replacing a
  // value counts only the difference.
  Status grow = (*client)->Set("huge", std::string(900 << 10, 'y'));
  ASSERT_FALSE(grow.ok());
  EXPECT_NE(grow.message().find("allowed: at most 4 keys and 1048576 bytes"), std::string::npos)
      << grow.ToString();
  EXPECT_TRUE((*client)->Set("big", std::string(800 << 10, 'z')).ok());
  // The key count is bounded too: "k", "big" and two more.
  EXPECT_TRUE((*client)->Set("a", "1").ok());
  EXPECT_TRUE((*client)->Set("b", "2").ok());
  Status fifth = (*client)->Set("c", "3");
  EXPECT_FALSE(fifth.ok());
  EXPECT_NE(fifth.message().find("4 keys"), std::string::npos) << fifth.ToString();
  // Refusals leave the connection and the coordinator serving.
  auto still = (*client)->Get({"a", "k"}, 0ms);
  ASSERT_TRUE(still.ok()) << still.status().ToString();
  EXPECT_EQ(still->at(0), "1");
  ExpectServes(*coordinator);
}

// The adaptive split writes a round of rates every adaptive_interval steps
// and never deletes them: under the key bound a long run would have been
// refused. A new round retires every round before the previous one.
TEST(CoordinatorLimitsTest, OldRoundsOfRatesAreRetired) {
  CoordinatorOptions options = CappedAt(64, 1);
  options.max_store_keys = 8;
  auto coordinator = StartWith(options);
  ASSERT_TRUE(coordinator);
  auto client = CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 5s);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  // Rates are a registered worker's to write (see below).
  ASSERT_TRUE((*client)->Register(Member(Role::kWorker, 0), 2s).ok());
  for (uint64_t step = 20; step <= 2000; step += 20) {  // 100 rounds of 2 workers
    for (int rank = 0; rank < 2; ++rank) {
      const std::string key = "rates/" + std::to_string(step) + "/" + std::to_string(rank);
      ASSERT_TRUE((*client)->Set(key, "1.5").ok()) << key;
    }
  }
  auto latest =
      (*client)->Get({"rates/1980/0", "rates/1980/1", "rates/2000/0", "rates/2000/1"}, 0ms);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_FALSE((*client)->Get({"rates/1960/0"}, 0ms).ok()) << "retired";
  EXPECT_FALSE((*client)->Get({"rates/20/1"}, 0ms).ok()) << "retired";
  // Other keys are untouched.
  ASSERT_TRUE((*client)->Set("ratesx", "kept").ok());
  ASSERT_TRUE((*client)->Set("rates/2020/0", "1").ok());
  EXPECT_TRUE((*client)->Get({"ratesx", "rates/2000/1"}, 0ms).ok());
}

TEST(CoordinatorLimitsTest, PartialMessagesShareABoundedBudget) {
  CoordinatorOptions options;
  options.max_pending_bytes = 2 << 20;
  auto coordinator = StartWith(options);
  ASSERT_TRUE(coordinator);
  // Each announces the largest message a connection that has not registered
  // may send (1 MiB). a sends 300 KiB of it and b then all but 8 bytes:
  // b's bytes would take the unfinished bytes of such connections past half
  // the budget, and b holds the most, so b is refused, not a.
  RawConnection a(coordinator->port()), b(coordinator->port());
  a.Send(LengthPrefix(1u << 20) + std::string(300 << 10, 'x'));
  std::this_thread::sleep_for(200ms);
  b.Send(LengthPrefix(1u << 20) + std::string((1u << 20) - 8, 'x'));
  auto reply = b.ReadReply(5s);
  ASSERT_TRUE(reply.decoded) << "eof " << reply.eof << ", timeout " << reply.timeout;
  EXPECT_NE(reply.text.find("have not registered hold"), std::string::npos) << reply.text;
  EXPECT_NE(reply.text.find("the most"), std::string::npos) << reply.text;
  EXPECT_NE(reply.text.find("max_pending_bytes"), std::string::npos) << reply.text;
  EXPECT_TRUE(b.WaitForClose(3s));
  ExpectServes(*coordinator);
  // a's message is still read: it finishes (a malformed body, refused as such).
  a.Send(std::string((1u << 20) - (300 << 10), 'x'));
  reply = a.ReadReply(5s);
  ASSERT_TRUE(reply.decoded) << "eof " << reply.eof << ", timeout " << reply.timeout;
  EXPECT_EQ(reply.text.find("unfinished messages"), std::string::npos) << reply.text;
  // Past 1 MiB, such a connection is refused at the length prefix.
  RawConnection c(coordinator->port());
  c.Send(LengthPrefix(16u << 20));
  reply = c.ReadReply(5s);
  ASSERT_TRUE(reply.decoded) << "eof " << reply.eof << ", timeout " << reply.timeout;
  EXPECT_NE(reply.text.find("until it registers"), std::string::npos) << reply.text;
}

// A hostile probe: 16 connections each holding 16 MiB of an unfinished
// message filled the budget, the workers' next requests were refused and
// the job stopped. Connections that have not registered now hold at most
// half of it, so a registered member's requests still get through however
// many strangers hold their share.
TEST(CoordinatorLimitsTest, StrangersCannotCrowdOutRegisteredMembers) {
  auto coordinator = StartWith(TwoMiBBudget());
  ASSERT_TRUE(coordinator);
  auto member = RegisteredMember(*coordinator);
  ASSERT_TRUE(member.ok()) << member.status().ToString();
  // Strangers take all the share they may (the first, holding the most, is
  // closed to make room for the third).
  std::vector<std::unique_ptr<RawConnection>> strangers;
  for (int c = 0; c < 3; ++c) {
    strangers.push_back(std::make_unique<RawConnection>(coordinator->port()));
    strangers.back()->Send(LengthPrefix(1u << 20) + std::string(400 << 10, 'x'));
    std::this_thread::sleep_for(100ms);
  }
  auto refused = strangers.front()->ReadReply(3s);
  ASSERT_TRUE(refused.decoded) << "eof " << refused.eof << ", timeout " << refused.timeout;
  EXPECT_NE(refused.text.find("closed to make room"), std::string::npos) << refused.text;
  // The member sends a request larger than what is left of the strangers'
  // share: served.
  const std::string value(900 << 10, 'm');
  ASSERT_TRUE((*member)->Set("member/big", value).ok());
  auto got = (*member)->Get({"member/big"}, 0ms);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->at(0).size(), value.size());
  EXPECT_TRUE((*member)->Heartbeat().ok());
}

}  // namespace
}  // namespace gridsync
