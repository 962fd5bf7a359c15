// One PS shard against what it must refuse: malformed and mutated messages
// over a real socket, a stale job's worker, rows another shard owns. Each
// gets an Error naming it and the shard keeps serving. What it holds for
// peers (waiting pulls, unsent replies) is bounded: shard_bounds_test.cc.
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstring>

#include "spec/cluster_settings.h"
#include "tests/ps_test_util.h"
#include "tests/zmtp_peer.h"

namespace gridsync {
namespace {

// ---- Malformed input over a real socket ----
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

// A review: under async a push's step was never looked at, so a push sent
// twice (a replay by a holder of the workers' key, a client bug) was
// applied twice. Each worker's steps now go in order, once each.
TEST(PsShardTest, AsyncAppliesEachWorkersStepOnce) {
  OneTableShard one =
      StartOneTableShard(64, Consistency::kAsync, [](ShardOptions& o) { o.workers = 2; });
  ASSERT_NE(one.shard, nullptr);
  const std::vector<wire::TableShape> shapes = ShapesOf(*one.partition);
  RawClient raw(one.shard->endpoint());
  uint64_t id = 0;
  auto push = [&](uint32_t rank, uint64_t step) {
    return raw.Exchange(RowOneMessage(wire::Kind::kPush, ++id, /*job=*/0, /*min_version=*/0, rank,
                                      /*num_workers=*/2, step),
                        shapes);
  };
  auto first = push(0, 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->kind, wire::Kind::kPushAck) << first->error.ToString();
  EXPECT_EQ(first->step, 1u);
  for (const auto& [step, why] :
       {std::pair<uint64_t, const char*>{0, "pushed already"}, {2, "never pushed"}}) {
    auto refused = push(0, step);
    ASSERT_TRUE(refused.ok()) << refused.status().ToString();
    ASSERT_EQ(refused->kind, wire::Kind::kError) << "step " << step << " taken";
    EXPECT_NE(refused->error.message().find("push for step " + std::to_string(step) +
                                            " from worker 0, whose next step is 1"),
              std::string::npos)
        << refused->error.message();
    EXPECT_NE(refused->error.message().find(why), std::string::npos) << refused->error.message();
    EXPECT_NE(refused->error.message().find("allowed: step 1"), std::string::npos)
        << refused->error.message();
  }
  // Worker 1's clock is its own; the refused pushes applied nothing (the
  // version counts applied pushes).
  auto other = push(1, 0);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  ASSERT_EQ(other->kind, wire::Kind::kPushAck) << other->error.ToString();
  EXPECT_EQ(other->step, 2u);
  auto next = push(0, 1);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  ASSERT_EQ(next->kind, wire::Kind::kPushAck) << next->error.ToString();
  EXPECT_EQ(next->step, 3u);
  one.shard->Stop();
}

}  // namespace
}  // namespace gridsync
