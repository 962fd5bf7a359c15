// One PS shard against what it must refuse: malformed and mutated messages
// over a real socket, a stale job's worker, rows another shard owns. Each
// gets an Error naming it and the shard keeps serving.
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstring>

#include "spec/cluster_settings.h"
#include "tests/ps_test_util.h"
#include "tests/zmtp_peer.h"

namespace gridsync {
namespace {

// ---- Malformed input over a real socket ----
// A DEALER that reads nothing: one reply fills its queue, and its socket
// buffer is small, so what the shard sends it stays unsent.
zmq::socket_t GreedyDealer(zmq::context_t& context, const std::string& endpoint) {
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::rcvhwm, 1);
  socket.set(zmq::sockopt::rcvbuf, 4096);
  socket.connect(endpoint);
  return socket;
}

// A DEALER that reads what it is sent and queues what it sends without bound.
zmq::socket_t ReadingDealer(zmq::context_t& context, const std::string& endpoint) {
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::sndhwm, 0);
  socket.connect(endpoint);
  return socket;
}

// A pull of row 1 of table 0 by worker 0 of job 1, for `min_version` (1:
// the next; nobody pushes, so the pull waits).
std::vector<zmq::message_t> PullOfRowOne(uint64_t request_id, uint64_t min_version) {
  return RowOneMessage(wire::Kind::kPull, request_id, /*job=*/1, min_version);
}

// Nothing an unreadable message says can be trusted to name its sender,
// so the shard's log line names its connection (the line named no peer).
TEST(PsShardTest, AnUnreadableMessageIsLoggedWithItsPeer) {
  auto cluster = Cluster::Start(SmallConfig(1, 1));
  const std::vector<wire::TableShape> shapes = ShapesOf(*cluster->partition);
  RawClient raw(cluster->shards[0]->endpoint());
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  auto reply = raw.Exchange(Frames({std::string("\x13\x37not-capnp", 11)}), shapes);
  const std::string log =
      ::testing::internal::GetCapturedStdout() + ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->kind, wire::Kind::kError);
  EXPECT_NE(log.find("refused an unreadable message from 127.0.0.1:"), std::string::npos) << log;
}

TEST(PsShardTest, MalformedInputGetsErrorAndChangesNothing) {
  const ImageTask image = SmallImage();
  auto cluster = Cluster::Start(SmallConfig(1, 1));
  const Partition& partition = *cluster->partition;
  const std::vector<wire::TableShape> shapes = ShapesOf(partition);
  RawClient raw(cluster->shards[0]->endpoint());

  auto pull_table0 = [&]() -> std::vector<float> {
    auto reply = raw.Exchange(PullOfTable0(partition, 99, 0), shapes);
    EXPECT_TRUE(reply.ok()) << reply.status().ToString();
    if (!reply.ok() || reply->blocks.empty()) return {};
    return std::vector<float>(reply->blocks[0].values.begin(), reply->blocks[0].values.end());
  };
  const auto before = pull_table0();
  ASSERT_FALSE(before.empty());

  auto push_with = [&](auto mutate) {
    wire::OutHeader h;
    h.kind = wire::Kind::kPush;
    h.step = 0;
    h.request_id = 7;
    h.num_workers = 1;
    wire::OutBlock b;
    b.table = 0;
    b.width = partition.table(0).width;
    b.rows = {1, 2, 3};
    b.row_count = 3;
    b.values.assign(3 * b.width, 0.5f);
    mutate(h, b);
    std::vector<wire::OutBlock> blocks;
    blocks.push_back(std::move(b));
    return wire::Encode(h, std::move(blocks));
  };

  struct Case {
    std::string name;
    std::vector<zmq::message_t> frames;
    std::string expect;  // a piece of the error text
    // The refusal names the request whenever the header is readable (0: it is not).
    uint64_t request_id = 7;
  };
  std::vector<Case> cases;
  cases.push_back(
      {"random bytes", Frames({std::string("\x13\x37garbage-not-capnp-at-all", 25)}), "", 0});
  {
    auto f = push_with([](auto&, auto&) {});
    std::string header(static_cast<const char*>(f[0].data()), f[0].size() / 2);
    f[0] = zmq::message_t(header.data(), header.size());
    cases.push_back({"truncated header", std::move(f), "", 0});
  }
  cases.push_back({"unknown table", push_with([](auto&, auto& b) { b.table = 999; }), "table"});
  cases.push_back({"row out of range", push_with([&](auto&, auto& b) {
                     b.rows = {1, 2, 1u << 30};
                   }),
                   "row"});
  cases.push_back({"rows not ascending", push_with([](auto&, auto& b) {
                     b.rows = {3, 2, 1};
                   }),
                   "ascending"});
  {
    // The values frame one float short of rows x width.
    auto f = push_with([](auto&, auto&) {});
    f.back() = zmq::message_t(f.back().data(), f.back().size() - 4);
    cases.push_back({"lengths disagree", std::move(f), "bytes"});
  }
  cases.push_back(
      {"NaN value", push_with([](auto&, auto& b) { b.values[1] = std::nanf(""); }), "finite"});
  cases.push_back(
      {"infinite value", push_with([](auto&, auto& b) { b.values[0] = INFINITY; }), "finite"});
  cases.push_back(
      {"wrong worker count", push_with([](auto& h, auto&) { h.num_workers = 5; }), "worker"});
  cases.push_back({"step far ahead", push_with([](auto& h, auto&) { h.step = 40; }), "step"});
  cases.push_back({"another shard's push", push_with([](auto& h, auto&) { h.shard = 3; }),
                   "push addressed to shard 3 reached shard 0"});
  {
    auto f = push_with([](auto&, auto&) {});
    f.pop_back();  // the values frame
    cases.push_back({"missing frame", std::move(f), "frame"});
  }
  {
    // A header from a future protocol version: the real header, its
    // version field changed.
    auto f = push_with([](auto&, auto&) {});
    kj::Array<capnp::word> words = kj::heapArray<capnp::word>(f[0].size() / sizeof(capnp::word));
    std::memcpy(words.begin(), f[0].data(), words.size() * sizeof(capnp::word));
    capnp::FlatArrayMessageReader reader(words);
    capnp::MallocMessageBuilder builder;
    builder.setRoot(reader.getRoot<wire::schema::Header>());
    builder.getRoot<wire::schema::Header>().setVersion(
        static_cast<uint16_t>(wire::kProtocolVersion + 7));
    const auto flat = capnp::messageToFlatArray(builder);
    f[0] = zmq::message_t(flat.asBytes().begin(), flat.asBytes().size());
    cases.push_back({"wrong version", std::move(f), "protocol version", 0});
  }
  {
    // More frames than any valid message has.
    std::vector<zmq::message_t> f;
    for (uint32_t i = 0; i < wire::Limits{}.max_frames() + 5; ++i) f.emplace_back("x", 1);
    cases.push_back({"too many frames", std::move(f), "frames", 0});
  }
  // Every kind, with one sparse block and no frames: a kind no shard takes
  // (a reply, an error) is refused for its kind, whatever else is wrong;
  // of the requests, kinds without blocks are refused for listing one, the
  // others for the missing frames.
  using MK = wire::schema::MessageKind;
  for (MK kind : {MK::PUSH, MK::PUSH_ACK, MK::PULL, MK::PULL_REPLY, MK::ERROR, MK::STATS,
                  MK::STATS_REPLY, MK::INIT}) {
    const auto k = static_cast<wire::Kind>(kind);
    std::string expect = wire::LayoutOf(k).blocks
                             ? (wire::LayoutOf(k).row_ids ? "frames" : "values")
                             : "allowed: none";
    if (k != wire::Kind::kPush && k != wire::Kind::kPull && k != wire::Kind::kInit &&
        k != wire::Kind::kStats) {
      expect = std::string("a shard does not accept ") + wire::KindName(k) + " messages";
    }
    cases.push_back({std::string("one sparse block on a ") + wire::KindName(k),
                     HeaderWithOneSparseBlock(kind), expect});
  }
  {
    // A pullReply with its values frame decodes (its rows are the request's),
    // so the shard refuses it for its kind, before any block is used.
    auto f = HeaderWithOneSparseBlock(MK::PULL_REPLY);
    const std::vector<float> values(2, 1.0f);
    f.emplace_back(values.data(), values.size() * sizeof(float));
    cases.push_back({"pullReply to a shard", std::move(f), "does not accept pullReply"});
  }
  for (auto& c : cases) {
    auto reply = raw.Exchange(std::move(c.frames), shapes);
    ASSERT_TRUE(reply.ok()) << c.name << ": " << reply.status().ToString();
    EXPECT_EQ(reply->kind, wire::Kind::kError) << c.name;
    EXPECT_EQ(reply->request_id, c.request_id) << c.name;
    EXPECT_FALSE(reply->error.ok()) << c.name;
    EXPECT_FALSE(reply->error.message().empty()) << c.name;
    if (!c.expect.empty()) {
      EXPECT_NE(reply->error.message().find(c.expect), std::string::npos)
          << c.name << ": " << reply->error.message();
    }
  }
  EXPECT_GE(cluster->shards[0]->stats().errors, cases.size());
  EXPECT_EQ(AppliedSteps(*cluster->shards[0], 0u), 0u);
  EXPECT_EQ(pull_table0(), before) << "a refused message changed the shard";

  // A good client still trains against the same shard afterwards.
  auto reports = cluster->Train(image);
  ASSERT_TRUE(reports[0].ok()) << reports[0].status().ToString();
  EXPECT_EQ(AppliedSteps(*cluster->shards[0], 12u), 12u);
  ExpectBitIdentical(FlattenParams(*reports[0]->model),
                     SingleProcessParams(cluster->config, image));
}

// Black-box fuzzing of a live shard over its real socket: thousands of
// mutated real messages (bit flips, truncations, dropped and duplicated
// frames). The shard must stay up and keep answering a good client.
TEST(PsShardTest, MutatedRealMessagesNeverStopTheShard) {
  auto cluster = Cluster::Start(SmallConfig(2, 1));
  const Partition& partition = *cluster->partition;
  const std::vector<wire::TableShape> shapes = ShapesOf(partition);
  std::vector<std::vector<zmq::message_t>> seeds;
  for (wire::Kind kind :
       {wire::Kind::kPush, wire::Kind::kPull, wire::Kind::kInit, wire::Kind::kStats}) {
    wire::OutHeader h;
    h.kind = kind;
    h.request_id = 5;
    h.num_workers = 2;
    h.job = 1;  // the cluster's: a mutated job number must change nothing
    std::vector<wire::OutBlock> blocks;
    if (kind != wire::Kind::kStats) {
      wire::OutBlock b;
      b.table = 0;
      b.width = partition.table(0).width;
      b.rows = {1, 2, 3, 40};
      b.row_count = 4;
      if (wire::KindCarriesValues(kind)) b.values.assign(4 * b.width, 0.25f);
      blocks.push_back(std::move(b));
    }
    seeds.push_back(wire::Encode(h, std::move(blocks)));
  }
  std::mt19937 rng(7);
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.connect(cluster->shards[0]->endpoint());
  int sent = 0;
  for (int round = 0; round < 3000; ++round) {
    const auto& seed = seeds[rng() % seeds.size()];
    std::vector<zmq::message_t> frames;
    for (const auto& f : seed) frames.emplace_back(f.data(), f.size());
    switch (rng() % 4) {
      case 0: {  // bit flips anywhere
        auto& f = frames[rng() % frames.size()];
        for (int k = 0; k < 1 + static_cast<int>(rng() % 4) && f.size() > 0; ++k) {
          static_cast<uint8_t*>(f.data())[rng() % f.size()] ^=
              static_cast<uint8_t>(1u << (rng() % 8));
        }
        break;
      }
      case 1: {  // truncate a frame
        auto& f = frames[rng() % frames.size()];
        f = zmq::message_t(f.data(), f.size() == 0 ? 0 : rng() % f.size());
        break;
      }
      case 2:  // drop the last frame
        if (frames.size() > 1) frames.pop_back();
        break;
      default:  // duplicate a frame
        frames.emplace_back(frames.back().data(), frames.back().size());
    }
    ASSERT_TRUE(wire::SendMultipart(socket, frames).ok());
    ++sent;
    // Drain whatever came back; a push that happens to stay valid waits
    // for the other worker and gets no reply yet.
    while (wire::ReceiveMultipart(socket, 0, wire::Limits{}).ok()) {
    }
  }
  // Still serving: stats and a pull from a fresh client.
  RawClient good(cluster->shards[0]->endpoint());
  wire::OutHeader stats;
  stats.kind = wire::Kind::kStats;
  stats.request_id = 1;
  auto reply = good.Exchange(wire::Encode(stats, {}), shapes);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->kind, wire::Kind::kStatsReply);
  // Most mutations are refused; the shard may still be working through the
  // last ones (another socket), so wait for its count to get there.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (cluster->shards[0]->stats().errors <= static_cast<uint64_t>(sent) / 4 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(cluster->shards[0]->stats().errors, static_cast<uint64_t>(sent) / 4);
  auto pulled = good.Exchange(PullOfTable0(partition, 2, 2, /*job=*/1), shapes);
  ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
  EXPECT_EQ(pulled->kind, wire::Kind::kPullReply) << pulled->error.ToString();
}

// compression.pull: shards answer pulls with encoded deltas against each
// worker's replica (two-way compression). Pulls shrink by the codec's ratio
// and training stays where pull-uncompressed training goes: what a codec
// holds back is re-sent by the next pull of the row.
TEST(PsShardTest, ANewJobStartsAfreshAndAStaleWorkerIsRefusedByName) {
  auto cluster = Cluster::Start(SmallConfig(1, 1));
  const std::vector<wire::TableShape> shapes = ShapesOf(*cluster->partition);
  RawClient raw(cluster->shards[0]->endpoint());
  auto send = [&](wire::Kind kind, uint64_t job, uint64_t min_version) {
    return raw.Exchange(RowOneMessage(kind, 7, job, min_version), shapes);
  };
  auto expect_refused = [&](const Result<wire::Message>& reply, const std::string& text) {
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    ASSERT_EQ(reply->kind, wire::Kind::kError);
    EXPECT_NE(reply->error.message().find(text), std::string::npos) << reply->error.message();
  };
  auto pushed = send(wire::Kind::kPush, 1, 0);
  ASSERT_TRUE(pushed.ok());
  ASSERT_EQ(pushed->kind, wire::Kind::kPushAck) << pushed->error.ToString();
  auto first = send(wire::Kind::kPull, 1, 1);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->kind, wire::Kind::kPullReply) << first->error.ToString();
  EXPECT_NE(first->blocks[0].values[0], 0.0f) << "job 1 stepped row 1";
  EXPECT_EQ(AppliedSteps(*cluster->shards[0], 1u), 1u);

  // Job 2 has not begun: claiming it changes nothing.
  expect_refused(send(wire::Kind::kPull, 2, 0), "job 2 of worker 0 is not the cluster's");
  EXPECT_EQ(cluster->shards[0]->stats().applied_steps, 1u);

  // A worker of job 1 passes 'init' and leaves: the coordinator starts job 2.
  const uint16_t port = static_cast<uint16_t>(cluster->config.distributed.master_port);
  {
    auto worker = CoordinatorClient::Connect("127.0.0.1", port, 2s, {}, Role::kWorker);
    ASSERT_TRUE(worker.ok()) << worker.status().ToString();
    RegisterInfo info;
    info.role = Role::kWorker;
    info.node = "node0";
    info.tables = testing::SpecOf(cluster->config).model.tables;
    info.shared_settings = SharedSettings(testing::SpecOf(cluster->config));
    auto registered = (*worker)->Register(info, 2s);
    ASSERT_TRUE(registered.ok()) << registered.status().ToString();
    ASSERT_TRUE((*worker)->Barrier("init", 1, "worker-0", 2s).ok());
  }
  auto observer = CoordinatorClient::Connect("127.0.0.1", port, 2s);
  ASSERT_TRUE(observer.ok());
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  uint64_t job = 1;
  while (job < 2 && std::chrono::steady_clock::now() < deadline) {
    auto map = (*observer)->GetMap(false, 0ms);
    ASSERT_TRUE(map.ok()) << map.status().ToString();
    job = map->job;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(job, 2u) << "the coordinator did not start job 2 when job 1's worker left";

  // Job 2's first message: version 0, parameters as before any job.
  auto fresh = send(wire::Kind::kPull, 2, 0);
  ASSERT_TRUE(fresh.ok());
  ASSERT_EQ(fresh->kind, wire::Kind::kPullReply) << fresh->error.ToString();
  EXPECT_EQ(fresh->blocks[0].values[0], 0.0f);
  EXPECT_EQ(fresh->blocks[0].values[1], 0.0f);
  EXPECT_EQ(cluster->shards[0]->stats().applied_steps, 0u);

  // A worker left over from job 1: refused, by rank and job.
  expect_refused(send(wire::Kind::kPush, 1, 0), "worker 0 of job 1 is stale");
  expect_refused(send(wire::Kind::kPush, 1, 0), "serves job 2");
  EXPECT_EQ(cluster->shards[0]->stats().applied_steps, 0u) << "the stale push changed nothing";
  // Job 2 trains on.
  auto next = send(wire::Kind::kPush, 2, 0);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->kind, wire::Kind::kPushAck) << next->error.ToString();
  EXPECT_EQ(AppliedSteps(*cluster->shards[0], 1u), 1u);
}

// Issue (review): pulls for a version far ahead were held without bound
// until their timeouts; a peer could flood them. A pull beyond the next
// version is refused at once; of pulls for the next, the shard holds at
// most max(4096, 4 x workers) and refuses the next by name.
TEST(PsShardTest, WaitingPullsAreBounded) {
  auto cluster = Cluster::Start(SmallConfig(1, 1));
  const std::vector<wire::TableShape> shapes = ShapesOf(*cluster->partition);
  zmq::context_t context(1);
  zmq::socket_t socket = ReadingDealer(context, cluster->shards[0]->endpoint());
  auto next_error = [&]() -> Result<wire::Message> {
    auto reply = wire::ReceiveMultipart(socket, 10000, wire::Limits{});
    if (!reply.ok()) return reply.status();
    return wire::Decode(*reply, shapes, wire::Limits{});
  };
  {
    auto frames = PullOfRowOne(1, 1000000);  // far ahead: refused, not held
    ASSERT_TRUE(wire::SendMultipart(socket, frames).ok());
    auto far = next_error();
    ASSERT_TRUE(far.ok()) << far.status().ToString();
    ASSERT_EQ(far->kind, wire::Kind::kError);
    EXPECT_EQ(far->error.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(far->error.message().find(
                  "pull for version 1000000 while shard 0 is at version 0; allowed: at most 1"),
              std::string::npos)
        << far->error.message();
    EXPECT_EQ(cluster->shards[0]->serving_stats().waiting_pulls, 0u);
  }
  constexpr uint64_t kHeld = 4096;
  for (uint64_t id = 1; id <= kHeld + 1; ++id) {
    auto frames = PullOfRowOne(id, 1);
    ASSERT_TRUE(wire::SendMultipart(socket, frames).ok());
  }
  // The first reply is the refusal of the one past the bound; the held
  // ones wait for their version (or their timeout, long after this).
  auto reply = wire::ReceiveMultipart(socket, 10000, wire::Limits{});
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  auto decoded = wire::Decode(*reply, shapes, wire::Limits{});
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->kind, wire::Kind::kError);
  EXPECT_EQ(decoded->request_id, kHeld + 1);
  EXPECT_NE(decoded->error.message().find("holds 4096 pulls waiting for later versions already"),
            std::string::npos)
      << decoded->error.message();
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  while (cluster->shards[0]->serving_stats().waiting_pulls != kHeld &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(cluster->shards[0]->serving_stats().waiting_pulls, kHeld);
}

// A stopping shard used to leave the pulls waiting for their version
// unanswered: their workers learned of it only at their timeouts. Each now
// gets a reply naming the shard and why, before the socket closes.
TEST(PsShardTest, AStoppingShardAnswersThePullsWaitingOnIt) {
  auto cluster = Cluster::Start(SmallConfig(1, 1));
  const std::vector<wire::TableShape> shapes = ShapesOf(*cluster->partition);
  zmq::context_t context(1);
  zmq::socket_t socket = ReadingDealer(context, cluster->shards[0]->endpoint());
  constexpr uint64_t kPulls = 3;
  for (uint64_t id = 1; id <= kPulls; ++id) {
    auto frames = PullOfRowOne(id, 1);  // the next version: nobody pushes, so each pull waits
    ASSERT_TRUE(wire::SendMultipart(socket, frames).ok());
  }
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (cluster->shards[0]->serving_stats().waiting_pulls != kPulls &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(cluster->shards[0]->serving_stats().waiting_pulls, kPulls);
  const auto stopped_at = std::chrono::steady_clock::now();
  cluster->shards[0]->Stop();
  for (uint64_t id = 1; id <= kPulls; ++id) {
    auto reply = wire::ReceiveMultipart(socket, 5000, wire::Limits{});
    ASSERT_TRUE(reply.ok()) << "pull " << id << ": " << reply.status().ToString();
    auto decoded = wire::Decode(*reply, shapes, wire::Limits{});
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    ASSERT_EQ(decoded->kind, wire::Kind::kError);
    EXPECT_EQ(decoded->request_id, id);
    EXPECT_EQ(decoded->error.code(), StatusCode::kIOError);
    EXPECT_NE(decoded->error.message().find("shard 0 is stopping"), std::string::npos)
        << decoded->error.message();
  }
  // At the stop, not at a wait's timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - stopped_at, 10s);
}

// Issue (review): a peer that sends pulls and never reads the replies made
// the shard queue them without bound (ZeroMQ's high-water mark is off).
// Replies not yet written to a peer's socket are bounded per peer; past
// the bound its pulls are refused, and a reading client is served.
TEST(PsShardTest, RepliesAPeerDoesNotReadAreBounded) {
  // A pull of the table: 512 KiB.
  OneTableShard one = StartOneTableShard(
      1 << 16, Consistency::kAsync, [](ShardOptions& o) { o.max_unsent_bytes_per_peer = 4 << 20; });
  ASSERT_NE(one.shard, nullptr);
  const Partition* partition = one.partition.get();
  PsShard* shard = one.shard.get();
  const std::vector<wire::TableShape> shapes = ShapesOf(*partition);

  zmq::context_t context(1);
  zmq::socket_t greedy = GreedyDealer(context, shard->endpoint());
  // 400 pulls (200 MiB of replies), none read.
  for (uint64_t id = 1; id <= 400; ++id) {
    auto frames = PullOfTable0(*partition, id, 1);
    ASSERT_TRUE(wire::SendMultipart(greedy, frames).ok());
  }
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  uint64_t refused = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    auto stats = shard->serving_stats();
    refused = stats.refusals.count("IOError") ? stats.refusals.at("IOError") : 0;
    if (refused > 0 && shard->stats().pulls == 400) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_GT(refused, 0u) << "pulls past the per-peer bound must be refused";
  EXPECT_EQ(shard->stats().pulls, 400u);
  // A client that reads is served meanwhile.
  RawClient reader(shard->endpoint());
  auto reply = reader.Exchange(PullOfTable0(*partition, 500, 1), shapes);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->kind, wire::Kind::kPullReply) << reply->error.ToString();
  shard->Stop();
}

// Issue (review): 150 held pulls naming every row of the large levels took
// a shard from 156 MB to 2 GB until their timeouts. Held pulls' bytes are
// bounded too; past the bound a pull is refused by name, and the held ones
// are still served when their version comes.
TEST(PsShardTest, BytesOfWaitingPullsAreBounded) {
  constexpr uint32_t kRows = 1 << 16;
  // Each pull counts 2^16 raw ids twice (frame and rows): 512 KiB; two fit.
  OneTableShard one = StartOneTableShard(
      kRows, Consistency::kBsp, [](ShardOptions& o) { o.max_waiting_pull_bytes = 3 << 19; });
  ASSERT_NE(one.shard, nullptr);
  PsShard* shard = one.shard.get();
  const std::vector<wire::TableShape> shapes = ShapesOf(*one.partition);
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.connect(shard->endpoint());
  auto pull = [&](uint64_t request_id) {
    wire::OutHeader h;
    h.kind = wire::Kind::kPull;
    h.request_id = request_id;
    h.num_workers = 1;
    h.min_version = 1;
    wire::OutBlock b;
    b.table = 0;
    b.width = 2;
    b.raw_rows = true;
    for (uint32_t r = 0; r < kRows; ++r) b.rows.push_back(r);
    b.row_count = kRows;
    std::vector<wire::OutBlock> blocks;
    blocks.push_back(std::move(b));
    return wire::Encode(h, std::move(blocks));
  };
  for (uint64_t id = 1; id <= 3; ++id) {
    auto frames = pull(id);
    ASSERT_TRUE(wire::SendMultipart(socket, frames).ok());
  }
  auto reply = wire::ReceiveMultipart(socket, 10000, wire::Limits{});
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  auto refused = wire::Decode(*reply, shapes, wire::Limits{});
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  ASSERT_EQ(refused->kind, wire::Kind::kError);
  EXPECT_EQ(refused->request_id, 3u);
  EXPECT_NE(refused->error.message().find("allowed: at most 4096 pulls and 1572864 bytes"),
            std::string::npos)
      << refused->error.message();
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  while (shard->serving_stats().waiting_pulls != 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(shard->serving_stats().waiting_pulls, 2u);
  shard->Stop();
}

// Issue (review): a peer with nothing pending was never refused, so N
// identities that each ask once and never read made the shard hold N full
// replies, past the bound for all peers. Then (a hostile probe): fresh
// peers past that bound were refused, so eight connections that never read
// held all of it and every worker's next pull was refused, which ended the
// run. Now the connections holding replies longest are shut down (their
// replies dropped) until a peer that read its own fits: the queued bytes
// stay within the bound and one reply, and a client that reads is served.
TEST(PsShardTest, PeersThatDoNotReadAreShutDownForOnesThatDo) {
  // A pull of the table: 16 MiB; one reply and a quarter in all. Whole
  // replies: the reader takes one message a pull.
  OneTableShard one = StartOneTableShard(1 << 21, Consistency::kAsync, [](ShardOptions& o) {
    o.max_unsent_bytes = 20 << 20;
    o.reply_part_bytes = 0;
  });
  ASSERT_NE(one.shard, nullptr);
  const Partition* partition = one.partition.get();
  PsShard* shard = one.shard.get();
  const std::vector<wire::TableShape> shapes = ShapesOf(*partition);
  // A client that reads its replies, as a worker does from its first step.
  RawClient reader(shard->endpoint());
  auto first = reader.Exchange(PullOfTable0(*partition, 100, 1), shapes);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->kind, wire::Kind::kPullReply) << first->error.ToString();
  // Peers spoken by hand that never read a byte: a libzmq DEALER's I/O
  // thread reads a whole reply into its pipe, so on a loaded host the first
  // peer's reply had drained before the reader asked, and nobody needed to
  // be shut down (the test failed 3 runs in 6 beside a busy loop).
  const std::string endpoint = shard->endpoint();
  const auto port = static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
  constexpr int kPeers = 8;
  std::vector<std::unique_ptr<testing_zmtp::ZmtpPeer>> greedy;
  for (int p = 0; p < kPeers; ++p) {
    greedy.push_back(std::make_unique<testing_zmtp::ZmtpPeer>("127.0.0.1", port, 4096));
    ASSERT_TRUE(greedy.back()->AwaitReady());
    ASSERT_TRUE(
        greedy.back()->SendMessage(PullOfTable0(*partition, static_cast<uint64_t>(p + 1), 1)));
    std::this_thread::sleep_for(20ms);  // one after another: the oldest go first
  }
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  uint64_t refused = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    auto stats = shard->serving_stats();
    refused = stats.refusals.count("IOError") ? stats.refusals.at("IOError") : 0;
    if (shard->stats().pulls == kPeers + 1) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(shard->stats().pulls, static_cast<uint64_t>(kPeers + 1));
  // Fresh peers past the bound for all are refused: at most 20 MiB + one
  // reply pending, 2 of the 8 (the sockets' kernel buffers take a little
  // of each).
  EXPECT_GE(refused, static_cast<uint64_t>(kPeers - 4)) << "fresh peers past the bound for all";
  EXPECT_EQ(shard->serving_stats().peers_shed, 0u) << "a fresh peer shuts nobody down";
  // The reader is served (it was refused before): the connections holding
  // replies longest go, and the queued bytes stay within the bound.
  for (uint64_t id = 101; id < 104; ++id) {
    auto reply = reader.Exchange(PullOfTable0(*partition, id, 1), shapes);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(reply->kind, wire::Kind::kPullReply) << reply->error.ToString();
  }
  EXPECT_GE(shard->serving_stats().peers_shed, 1u);
  const uint64_t bound = (uint64_t{20} << 20) + (uint64_t{16} << 20);
  const auto settled = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < settled &&
         shard->serving_stats().unsent_bytes > bound) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_LE(shard->serving_stats().unsent_bytes, bound);
  shard->Stop();
}

TEST(PsShardTest, RowsOfAnotherShardAreRefused) {
  Config config = SmallConfig(1, 2);
  auto cluster = Cluster::Start(config);
  const Partition& partition = *cluster->partition;
  const std::vector<wire::TableShape> shapes = ShapesOf(partition);
  // Find a table whose first block belongs to shard 1 and send it to shard 0.
  uint32_t table = 0;
  while (partition.Owner(table, 0, 0) != 1) ++table;
  RawClient raw(cluster->shards[0]->endpoint());
  wire::OutHeader h;
  h.kind = wire::Kind::kPull;
  wire::OutBlock b;
  b.table = table;
  b.width = partition.table(table).width;
  b.rows = {0};
  b.row_count = 1;
  std::vector<wire::OutBlock> blocks;
  blocks.push_back(std::move(b));
  auto reply = raw.Exchange(wire::Encode(h, std::move(blocks)), shapes);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->kind, wire::Kind::kError);
  EXPECT_NE(reply->error.message().find("belongs to shard 1"), std::string::npos)
      << reply->error.message();
}

}  // namespace
}  // namespace gridsync
