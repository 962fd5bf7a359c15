// A shard holding a pull for a push that has not arrived: how long it
// holds it, given what the cluster's real coordinator answered (as
// gridsync-ps's periodic ping hands it to the shard). A worker behind a
// stalled network is silent for as long as TCP's backed-off resends take;
// while the coordinator still lists it, its peers' pulls are held once more
// (a hostile network probe: a 9 s outage against timeout_s 10 ended the job
// with every process alive, the held pull refused at 10 s).
#include "spec/cluster_settings.h"
#include "tests/ps_test_util.h"

namespace gridsync {
namespace {

class ShardPullWaitsTest : public ::testing::Test {
 protected:
  static constexpr double kTimeoutS = 2.0;

  void SetUp() override {
    Config config = SmallConfig(2, 1);
    config.distributed.timeout_s = kTimeoutS;
    cluster_ = Cluster::Start(config);
    ASSERT_NE(cluster_, nullptr);
    shapes_ = ShapesOf(*cluster_->partition);
  }

  // Worker `rank` of job 1 (of 2): a push of row 1 of table 0 for step 0,
  // or a pull of it for version 1 (held until both workers pushed step 0).
  static std::vector<zmq::message_t> Message(wire::Kind kind, uint32_t rank) {
    return RowOneMessage(kind, 10 + rank, /*job=*/1, kind == wire::Kind::kPull ? 1 : 0, rank,
                         /*num_workers=*/2);
  }

  // Worker 1 registered with the coordinator, its connection kept open (a
  // member of the job, as a worker behind a stalled network stays).
  void RegisterWorkerOne() {
    const auto port = static_cast<uint16_t>(cluster_->config.distributed.master_port);
    auto client = CoordinatorClient::Connect("127.0.0.1", port, 2s, {}, Role::kWorker);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    RegisterInfo info;
    info.role = Role::kWorker;
    info.requested_rank = 1;
    info.node = "node1";
    info.tables = testing::SpecOf(cluster_->config).model.tables;
    info.shared_settings = SharedSettings(testing::SpecOf(cluster_->config));
    auto registered = (*client)->Register(info, 2s);
    ASSERT_TRUE(registered.ok()) << registered.status().ToString();
    worker_one_ = std::move(client).value();
  }

  // What gridsync-ps's ping does: the coordinator's job state, read now,
  // handed to the shard.
  void NoteCoordinatorState() {
    const auto port = static_cast<uint16_t>(cluster_->config.distributed.master_port);
    auto observer = CoordinatorClient::Connect("127.0.0.1", port, 2s);
    ASSERT_TRUE(observer.ok()) << observer.status().ToString();
    const auto asked = std::chrono::steady_clock::now();
    auto state = (*observer)->CurrentJob();
    ASSERT_TRUE(state.ok()) << state.status().ToString();
    cluster_->shards[0]->NoteCoordinatorState(*state, asked);
  }

  // Worker 0 pushes step 0 and sends its pull for version 1 on `socket`.
  void PushAndPullAsWorkerZero(zmq::socket_t& socket) {
    RawClient pusher(cluster_->shards[0]->endpoint());
    auto acked = pusher.Exchange(Message(wire::Kind::kPush, 0), shapes_);
    ASSERT_TRUE(acked.ok()) << acked.status().ToString();
    ASSERT_EQ(acked->kind, wire::Kind::kPushAck) << acked->error.ToString();
    auto pull = Message(wire::Kind::kPull, 0);
    ASSERT_TRUE(wire::SendMultipart(socket, pull).ok());
    // Held: what is noted from here on was read after it arrived.
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (cluster_->shards[0]->serving_stats().waiting_pulls != 1 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    ASSERT_EQ(cluster_->shards[0]->serving_stats().waiting_pulls, 1u);
  }

  zmq::socket_t Dealer() {
    zmq::socket_t socket(context_, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 0);
    socket.connect(cluster_->shards[0]->endpoint());
    return socket;
  }

  Result<wire::Message> Reply(zmq::socket_t& socket, int wait_ms) {
    GRIDSYNC_ASSIGN_OR_RETURN(auto frames, wire::ReceiveMultipart(socket, wait_ms, wire::Limits{}));
    return wire::Decode(frames, shapes_, wire::Limits{});
  }

  // The pull's Timeout reply (waited for at most 10 s), naming worker 1's
  // push as missing, and how long after `sent` it came.
  void AwaitRefusal(zmq::socket_t& socket, std::chrono::steady_clock::time_point sent,
                    std::string* text, std::chrono::duration<double>* waited) {
    auto reply = Reply(socket, 10000);
    *waited = std::chrono::steady_clock::now() - sent;
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    ASSERT_EQ(reply->kind, wire::Kind::kError);
    EXPECT_EQ(reply->error.code(), StatusCode::kTimeout);
    *text = reply->error.message();
    EXPECT_NE(text->find("from workers [1]"), std::string::npos) << *text;
  }

  std::unique_ptr<Cluster> cluster_;
  std::vector<wire::TableShape> shapes_;
  std::unique_ptr<CoordinatorClient> worker_one_;
  zmq::context_t context_{1};
};

TEST_F(ShardPullWaitsTest, AMissingWorkerStillInTheJobIsWaitedForOnceMore) {
  ASSERT_NO_FATAL_FAILURE(RegisterWorkerOne());
  zmq::socket_t socket = Dealer();
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_NO_FATAL_FAILURE(PushAndPullAsWorkerZero(socket));
  ASSERT_NO_FATAL_FAILURE(NoteCoordinatorState());
  // Worker 1's push arrives after the first timeout: the pull is served.
  // Half a timeout past the first, half before the second.
  std::this_thread::sleep_until(sent + std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::duration<double>(kTimeoutS * 1.5)));
  RawClient late(cluster_->shards[0]->endpoint());
  auto acked = late.Exchange(Message(wire::Kind::kPush, 1), shapes_);
  ASSERT_TRUE(acked.ok()) << acked.status().ToString();
  ASSERT_EQ(acked->kind, wire::Kind::kPushAck) << acked->error.ToString();
  auto reply = Reply(socket, 5000);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->kind, wire::Kind::kPullReply)
      << "the pull was not held past its first timeout: " << reply->error.ToString();
}

TEST_F(ShardPullWaitsTest, AWaitOnAMemberThatStaysSilentEndsAfterTwoTimeoutsNamingIt) {
  ASSERT_NO_FATAL_FAILURE(RegisterWorkerOne());
  zmq::socket_t socket = Dealer();
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_NO_FATAL_FAILURE(PushAndPullAsWorkerZero(socket));
  ASSERT_NO_FATAL_FAILURE(NoteCoordinatorState());
  std::string text;
  std::chrono::duration<double> waited{};
  ASSERT_NO_FATAL_FAILURE(AwaitRefusal(socket, sent, &text, &waited));
  EXPECT_NE(text.find("twice (the missing workers were members of the job at the first timeout)"),
            std::string::npos)
      << text;
  EXPECT_GE(waited, std::chrono::duration<double>(2 * kTimeoutS * 0.95));
}

TEST_F(ShardPullWaitsTest, AMissingWorkerNotInTheJobEndsTheWaitAtTheFirstTimeout) {
  // Worker 1 never registered (or left): its peers hear of it at the first
  // timeout.
  zmq::socket_t socket = Dealer();
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_NO_FATAL_FAILURE(PushAndPullAsWorkerZero(socket));
  ASSERT_NO_FATAL_FAILURE(NoteCoordinatorState());
  std::string text;
  std::chrono::duration<double> waited{};
  ASSERT_NO_FATAL_FAILURE(AwaitRefusal(socket, sent, &text, &waited));
  EXPECT_EQ(text.find("twice"), std::string::npos) << text;
  EXPECT_GE(waited, std::chrono::duration<double>(kTimeoutS * 0.95));
  EXPECT_LT(waited, std::chrono::duration<double>(2 * kTimeoutS * 0.95)) << "held once more";
  EXPECT_EQ(text.find("the coordinator answered none"), std::string::npos)
      << "it answered after the pull arrived: " << text;
}

// What the coordinator said before the pull arrived says nothing of the
// wait: the worker may have left since.
TEST_F(ShardPullWaitsTest, AStateNotedBeforeThePullArrivedIsNotUsed) {
  ASSERT_NO_FATAL_FAILURE(RegisterWorkerOne());
  ASSERT_NO_FATAL_FAILURE(NoteCoordinatorState());
  std::this_thread::sleep_for(50ms);
  zmq::socket_t socket = Dealer();
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_NO_FATAL_FAILURE(PushAndPullAsWorkerZero(socket));
  std::string text;
  std::chrono::duration<double> waited{};
  ASSERT_NO_FATAL_FAILURE(AwaitRefusal(socket, sent, &text, &waited));
  EXPECT_EQ(text.find("twice"), std::string::npos) << text;
  EXPECT_LT(waited, std::chrono::duration<double>(2 * kTimeoutS * 0.95)) << "held once more";
  // Nor did it answer since: the refusal says so, for the workers named
  // may be waiting on it (a hostile probe: a frozen coordinator read as
  // missing pushes alone).
  EXPECT_NE(text.find("the coordinator answered none of this shard's calls made in the last"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace gridsync
