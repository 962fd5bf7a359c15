// Pull replies in parts (ShardOptions::reply_part_bytes, gridsync.capnp's
// partRow and moreParts): a real shard's parts land exactly as its whole
// reply does, and a client refuses, by name, parts from a shard that does
// not continue what it asked for, without crashing or buffering without
// bound.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/sharding.h"
#include "common/wire/message.h"
#include "server/ps_shard.h"
#include "tests/fake_shard.h"
#include "tools/bench_shard_map.h"
#include "worker/ps_client.h"

namespace gridsync {
namespace {

constexpr auto kTimeout = std::chrono::milliseconds(10000);

// Three tables: two sparse grid levels of different widths and a small
// dense one (an MLP layer), so that parts cut blocks and span them.
const std::vector<TableInfo> kTables = {{"level0", 3000, 2}, {"level1", 1000, 4}, {"mlp", 40, 8}};

float InitialValue(uint32_t table, uint64_t i) {
  return static_cast<float>((i * 2654435761u + table * 977) % 1000) / 1000.0f - 0.5f;
}

struct Served {
  std::unique_ptr<PsShard> shard;
  std::unique_ptr<PsClient> client;
  std::vector<std::vector<float>> model;  // by table: the client's pull destination
};

Served Serve(const Partition& partition, uint64_t reply_part_bytes) {
  Served s;
  ShardOptions options;
  options.endpoint = "tcp://127.0.0.1:0";
  options.workers = 1;
  options.consistency = Consistency::kAsync;
  options.reply_part_bytes = reply_part_bytes;
  auto shard = PsShard::Start(partition, options);
  EXPECT_TRUE(shard.ok()) << shard.status().ToString();
  if (!shard.ok()) return s;
  s.shard = std::move(shard).value();
  auto client = PsClient::Connect(bench::OneShardMap(s.shard->endpoint(), kTables, 1), partition, 0,
                                  1, kTimeout);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  if (!client.ok()) return s;
  s.client = std::move(client).value();
  for (uint32_t t = 0; t < kTables.size(); ++t) {
    std::vector<float> init(kTables[t].rows * kTables[t].width);
    for (size_t i = 0; i < init.size(); ++i) init[i] = InitialValue(t, i);
    const Status status =
        s.client->Push(wire::Kind::kInit, 0, {{t, true, nullptr, 0, init.data()}});
    EXPECT_TRUE(status.ok()) << status.ToString();
    // A value a pull that skipped a row would leave behind.
    s.model.emplace_back(init.size(), -7.0f);
  }
  return s;
}

TEST(PsClientPartsTest, PartsLandExactlyAsAWholeReply) {
  auto partition = Partition::Make(kTables, 1, ModelParallelDim::kRow);
  ASSERT_TRUE(partition.ok()) << partition.status().ToString();
  // 100 bytes: parts of a dozen rows, cutting every block many times.
  Served parts = Serve(*partition, 100);
  Served whole = Serve(*partition, 0);
  ASSERT_NE(parts.client, nullptr);
  ASSERT_NE(whole.client, nullptr);

  std::vector<uint32_t> rows0, rows1;
  for (uint32_t r = 1; r < 3000; r += 3) rows0.push_back(r);
  for (uint32_t r = 0; r < 1000; r += 7) rows1.push_back(r);
  std::vector<float> grad0(rows0.size() * 2, 0.25f), grad1(rows1.size() * 4, -0.5f);
  for (Served* s : {&parts, &whole}) {
    const Status pushed = s->client->Push(wire::Kind::kPush, 0,
                                          {{0, false, rows0.data(), rows0.size(), grad0.data()},
                                           {1, false, rows1.data(), rows1.size(), grad1.data()}});
    ASSERT_TRUE(pushed.ok()) << pushed.ToString();
    const std::vector<TablePullRef> pull = {
        {0, false, rows0.data(), rows0.size(), s->model[0].data()},
        {1, false, rows1.data(), rows1.size(), s->model[1].data()},
        {2, true, nullptr, 0, s->model[2].data()}};
    ASSERT_TRUE(s->client->SendPull(0, pull).ok());
    auto version = s->client->ReceivePull();
    ASSERT_TRUE(version.ok()) << version.status().ToString();
    EXPECT_EQ(*version, 1u);
  }
  // A requested block of no rows between two that are cut into parts.
  for (Served* s : {&parts, &whole}) {
    const std::vector<TablePullRef> pull = {
        {0, false, rows0.data(), rows0.size(), s->model[0].data()},
        {1, false, rows1.data(), 0, s->model[1].data()},
        {2, true, nullptr, 0, s->model[2].data()}};
    ASSERT_TRUE(s->client->SendPull(0, pull).ok());
    auto version = s->client->ReceivePull();
    ASSERT_TRUE(version.ok()) << version.status().ToString();
  }
  for (uint32_t t = 0; t < kTables.size(); ++t) {
    ASSERT_EQ(parts.model[t].size(), whole.model[t].size());
    EXPECT_EQ(std::memcmp(parts.model[t].data(), whole.model[t].data(),
                          parts.model[t].size() * sizeof(float)),
              0)
        << "table " << t;
  }
  // The pulled rows moved (the push was applied), the others were not written.
  EXPECT_NE(parts.model[0][1 * 2], InitialValue(0, 2));
  EXPECT_EQ(parts.model[0][2 * 2], -7.0f);
  EXPECT_EQ(parts.model[2][5], InitialValue(2, 5));

  // And the shard did send parts: a raw pull of table 0 whole comes back in
  // messages that continue each other, the last without moreParts.
  zmq::context_t context(1);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(parts.shard->endpoint());
  wire::OutHeader h;
  h.kind = wire::Kind::kPull;
  h.request_id = 99;
  h.num_workers = 1;
  h.job = bench::OneShardMap(parts.shard->endpoint(), kTables, 1).job;  // the clients' job
  wire::OutBlock b;
  b.table = 0;
  b.dense = true;
  b.width = 2;
  b.row_count = 3000;
  std::vector<wire::OutBlock> blocks;
  blocks.push_back(std::move(b));
  auto frames = wire::Encode(h, std::move(blocks));
  ASSERT_TRUE(wire::SendMultipart(dealer, frames).ok());
  const std::vector<wire::TableShape> shapes = {{3000, 2}, {1000, 4}, {40, 8}};
  uint64_t next_row = 0;
  int messages = 0;
  bool more = true;
  while (more) {
    auto reply = wire::ReceiveMultipart(dealer, 5000, wire::Limits{});
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    auto m = wire::Decode(*reply, shapes, wire::Limits{});
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_EQ(m->kind, wire::Kind::kPullReply);
    ASSERT_EQ(m->part_row, next_row);
    ASSERT_EQ(m->blocks.size(), 1u);
    EXPECT_LE(m->blocks[0].values.size() * sizeof(float), 100u + 8u);
    next_row += m->blocks[0].row_count;
    more = m->more_parts;
    ++messages;
  }
  EXPECT_EQ(next_row, 3000u);
  EXPECT_GT(messages, 100);
}

struct Hostile {
  std::unique_ptr<Partition> partition;
  FakeShard fake;
  std::unique_ptr<PsClient> client;
  std::vector<uint32_t> rows;  // the pull's: 10 rows of table 0
  std::vector<float> dest;
};

std::unique_ptr<Hostile> ConnectToFake(std::chrono::milliseconds timeout = kTimeout) {
  auto h = std::make_unique<Hostile>();
  const std::vector<TableInfo> tables = {{"level0", 1000, 2}, {"level1", 1000, 2}};
  auto partition = Partition::Make(tables, 1, ModelParallelDim::kRow);
  EXPECT_TRUE(partition.ok());
  if (!partition.ok()) return nullptr;
  h->partition = std::make_unique<Partition>(std::move(partition).value());
  auto client = PsClient::Connect(bench::OneShardMap(h->fake.endpoint(), tables, 1), *h->partition,
                                  0, 1, timeout);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  if (!client.ok()) return nullptr;
  h->client = std::move(client).value();
  for (uint32_t r = 0; r < 10; ++r) h->rows.push_back(r * 5);
  h->dest.assign(1000 * 2, -7.0f);
  return h;
}

// Sends the pull, lets `answer` reply to it as the fake shard, and returns
// what ReceivePull makes of that.
template <typename Answer>
Status PullFromFake(Hostile& h, Answer answer) {
  Status sent = h.client->SendPull(0, {{0, false, h.rows.data(), h.rows.size(), h.dest.data()}});
  if (!sent.ok()) return sent;
  auto request = h.fake.Receive();
  if (!request.ok()) return request.status();
  answer(*request);
  return h.client->ReceivePull().status();
}

TEST(PsClientPartsTest, AFakeShardsValidPartsLand) {
  auto h = ConnectToFake();
  ASSERT_NE(h, nullptr);
  // The harness itself: parts that continue each other are taken.
  const Status status = PullFromFake(*h, [&](uint64_t id) {
    h->fake.SendPart(id, 0, true, 4);
    h->fake.SendPart(id, 4, true, 3);
    h->fake.SendPart(id, 7, false, 3);
  });
  EXPECT_TRUE(status.ok()) << status.ToString();
  for (uint32_t r : h->rows) EXPECT_EQ(h->dest[r * 2], 0.5f) << "row " << r;
  EXPECT_EQ(h->dest[1 * 2], -7.0f);
}

TEST(PsClientPartsTest, PartsThatDoNotContinueTheRequestAreRefusedByName) {
  struct Case {
    const char* name;
    std::function<void(FakeShard&, uint64_t)> answer;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"gap",
       [](FakeShard& f, uint64_t id) {
         f.SendPart(id, 0, true, 4);
         f.SendPart(id, 5, false, 5);
       },
       "from row 5; allowed: row 4"},
      {"repeat",
       [](FakeShard& f, uint64_t id) {
         f.SendPart(id, 0, true, 4);
         f.SendPart(id, 0, false, 10);
       },
       "from row 0; allowed: row 4"},
      {"too many rows",
       [](FakeShard& f, uint64_t id) {
         f.SendPart(id, 0, true, 4);
         f.SendPart(id, 4, false, 7);
       },
       "allowed: the requested block's next 1..6 rows"},
      {"another table",
       [](FakeShard& f, uint64_t id) { f.SendPart(id, 0, false, 10, /*table=*/1); },
       "rows of table 1"},
      {"ends early",
       [](FakeShard& f, uint64_t id) {
         f.SendPart(id, 0, true, 4);
         f.SendPart(id, 4, false, 2);
       },
       "ended its pull reply at row 6"},
      {"more after the last row", [](FakeShard& f, uint64_t id) { f.SendPart(id, 0, true, 10); },
       "announced more parts of its pull reply after its last requested row"},
  };
  for (const Case& c : cases) {
    auto h = ConnectToFake();
    ASSERT_NE(h, nullptr);
    const Status status = PullFromFake(*h, [&](uint64_t id) { c.answer(h->fake, id); });
    EXPECT_EQ(status.code(), StatusCode::kCorruption) << c.name << ": " << status.ToString();
    EXPECT_NE(status.message().find(c.expect), std::string::npos)
        << c.name << ": " << status.ToString();
  }
}

// The client sends its pull, then a push, from a thread of its own, which
// waits for its ack; the fake shard has received both. The push's status
// is in `pushed` once `pusher` is joined.
struct PushBehindPull {
  uint64_t pull = 0, push = 0;
  std::vector<uint32_t> rows = {1, 2};
  std::vector<float> grad = std::vector<float>(4, 0.1f);
  Status pushed;
  std::thread pusher;
  // A test that stopped early still waits for the push (it fails by the
  // client's timeout at the latest) instead of ending with a live thread.
  ~PushBehindPull() {
    if (pusher.joinable()) pusher.join();
  }
};

void StartPushBehindPull(Hostile& h, PushBehindPull* p) {
  ASSERT_TRUE(
      h.client->SendPull(0, {{0, false, h.rows.data(), h.rows.size(), h.dest.data()}}).ok());
  auto pull = h.fake.Receive();
  ASSERT_TRUE(pull.ok()) << pull.status().ToString();
  p->pull = *pull;
  p->pusher = std::thread([&h, p] {
    p->pushed =
        h.client->Push(wire::Kind::kPush, 0, {{0, false, p->rows.data(), 2, p->grad.data()}});
  });
  auto push = h.fake.Receive();
  ASSERT_TRUE(push.ok()) << push.status().ToString();
  p->push = *push;
}

TEST(PsClientPartsTest, EarlyPartsAreBoundedWhileAPushWaits) {
  auto h = ConnectToFake();
  ASSERT_NE(h, nullptr);
  PushBehindPull p;
  StartPushBehindPull(*h, &p);
  ASSERT_TRUE(p.pusher.joinable());
  // The pull asked for 80 bytes of values; parts of the pull flood in
  // while the push waits for its ack, and no ack ever comes.
  for (int i = 0; i < 5; ++i) {
    wire::OutHeader header;
    header.kind = wire::Kind::kPullReply;
    header.request_id = p.pull;
    header.more_parts = true;
    std::vector<zmq::message_t> frames = wire::Encode(header, {});
    // Zeros, so that valgrind's memcheck of the suite sees no unwritten
    // bytes sent.
    zmq::message_t filler(300 * 1024);
    std::memset(filler.data(), 0, filler.size());
    frames.push_back(std::move(filler));
    h->fake.SendFrames(std::move(frames));
  }
  p.pusher.join();
  EXPECT_EQ(p.pushed.code(), StatusCode::kCorruption) << p.pushed.ToString();
  EXPECT_NE(p.pushed.message().find("before it was read"), std::string::npos)
      << p.pushed.ToString();
}

TEST(PsClientPartsTest, EarlyPartsWaitForTheirPull) {
  auto h = ConnectToFake();
  ASSERT_NE(h, nullptr);
  PushBehindPull p;
  StartPushBehindPull(*h, &p);
  ASSERT_TRUE(p.pusher.joinable());
  const uint64_t pull = p.pull;
  // Two parts arrive before the ack; the pull takes them, in order, after.
  h->fake.SendPart(pull, 0, true, 6);
  h->fake.SendPart(pull, 6, true, 2);
  h->fake.SendAck(p.push);
  p.pusher.join();
  ASSERT_TRUE(p.pushed.ok()) << p.pushed.ToString();
  EXPECT_EQ(h->dest[h->rows[0] * 2], -7.0f);  // not before ReceivePull
  h->fake.SendPart(pull, 8, false, 2);
  auto version = h->client->ReceivePull();
  ASSERT_TRUE(version.ok()) << version.status().ToString();
  for (uint32_t r : h->rows) EXPECT_EQ(h->dest[r * 2], 0.5f) << "row " << r;
}

// A hostile network probe: a 7 s outage against timeout_s 10 ended the job
// with every process alive, since TCP resent the lost reply only on its
// backed-off timer, after the wait (1.25 x timeout) ran out. A shard the
// coordinator still lists is waited for once more; one it does not list,
// or one silent through both waits, is named as before.
TEST(PsClientPartsTest, AStalledShardStillInTheJobIsWaitedForOnceMore) {
  using std::chrono::milliseconds;
  const milliseconds timeout(1000);  // a wait of 1 s + 1 s of grace
  for (const bool member : {true, false}) {
    auto h = ConnectToFake(timeout);
    ASSERT_NE(h, nullptr);
    int asked = 0;
    h->client->SetStallCheck([&](uint32_t shard) {
      EXPECT_EQ(shard, 0u);
      ++asked;
      return member;
    });
    const auto start = std::chrono::steady_clock::now();
    std::thread late;
    const Status status = PullFromFake(*h, [&](uint64_t id) {
      late = std::thread([&fake = h->fake, id] {
        std::this_thread::sleep_for(milliseconds(2500));  // past the first wait
        fake.SendPart(id, 0, false, 10);
      });
    });
    const auto took = std::chrono::steady_clock::now() - start;
    if (late.joinable()) late.join();  // the late reply went out
    EXPECT_EQ(asked, 1) << member;
    if (member) {
      EXPECT_TRUE(status.ok()) << status.ToString();
      EXPECT_GE(took, milliseconds(2400));
    } else {
      EXPECT_EQ(status.code(), StatusCode::kTimeout) << status.ToString();
      EXPECT_LT(took, milliseconds(2400));
    }
  }
  // Silent through both waits: the timeout says it waited twice.
  auto h = ConnectToFake(timeout);
  ASSERT_NE(h, nullptr);
  h->client->SetStallCheck([](uint32_t) { return true; });
  const Status silent = PullFromFake(*h, [](uint64_t) {});
  EXPECT_EQ(silent.code(), StatusCode::kTimeout);
  EXPECT_NE(silent.message().find("within 2.000 s twice (still members of the job)"),
            std::string::npos)
      << silent.ToString();
}

// A signal that lands while the client waits in poll (a profiler's, a
// supervisor's; libFuzzer's timer found it) is no failure: the waits go on.
// The handler is installed without SA_RESTART, so every signal that lands
// in a wait interrupts it with EINTR.
TEST(PsClientSignalTest, SignalsDuringWaitsAreNoFailure) {
  struct sigaction quiet {};
  quiet.sa_handler = [](int) {};
  sigemptyset(&quiet.sa_mask);
  quiet.sa_flags = 0;
  struct sigaction before {};
  ASSERT_EQ(sigaction(SIGUSR2, &quiet, &before), 0);
  auto partition = Partition::Make(kTables, 1, ModelParallelDim::kRow);
  ASSERT_TRUE(partition.ok()) << partition.status().ToString();
  Served s = Serve(*partition, 100);
  ASSERT_NE(s.client, nullptr);
  std::vector<uint32_t> rows;
  for (uint32_t r = 0; r < 3000; r += 2) rows.push_back(r);
  std::vector<float> grad(rows.size() * 2, 0.125f);
  const pthread_t waiter = pthread_self();
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::thread signaller([&] {
    while (!stop.load()) {
      pthread_kill(waiter, SIGUSR2);
      sent.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  Status failed;
  for (int i = 0; i < 200 && failed.ok(); ++i) {
    failed = s.client->Push(wire::Kind::kPush, static_cast<uint64_t>(i),
                            {{0, false, rows.data(), rows.size(), grad.data()}});
    if (!failed.ok()) break;
    failed = s.client->SendPull(0, {{0, false, rows.data(), rows.size(), s.model[0].data()}});
    if (!failed.ok()) break;
    failed = s.client->ReceivePull().status();
  }
  stop.store(true);
  signaller.join();
  sigaction(SIGUSR2, &before, nullptr);
  EXPECT_TRUE(failed.ok()) << failed.ToString();
  EXPECT_GT(sent.load(), 100);
}

}  // namespace
}  // namespace gridsync
