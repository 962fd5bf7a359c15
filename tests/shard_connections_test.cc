// A PS shard against what its connections can make it hold
// (wire::ConnectionCap): connections past the caps, messages that never
// end, and the count of what it took from each connection, which must
// match the wire exactly. Other hosts are other 127/8 source addresses.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstring>

#include "tests/ps_test_util.h"
#include "tests/zmtp_peer.h"

namespace gridsync {
namespace {

using testing_zmtp::ConnectFrom;
using testing_zmtp::ZmtpPeer;

uint16_t PortOf(const PsShard& shard) {
  const std::string endpoint = shard.endpoint();
  return static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
}

// Whether the peer closed `fd` within `wait` (what it sends meanwhile, the
// ZMTP greeting, is read and dropped).
bool ClosedWithin(int fd, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  char buf[256];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
  }
}

template <typename Predicate>
bool Eventually(Predicate predicate) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!predicate()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// ---- Connections (a hostile probe: 10,500 connections grew a shard to
// 968 MB; ZeroMQ keeps each one's buffers whatever the shard does) ----

// Past a cap, a connection that never sent a whole message goes, the
// oldest first: refusing the new one let connections held open lock a
// restarted worker out (a hostile probe). One that sends is kept.
TEST(ShardConnectionsTest, PastTheCapsTheOldestSilentConnectionGoes) {
  OneTableShard one = StartOneTableShard(1 << 10, Consistency::kAsync, [](ShardOptions& o) {
    o.connections.max_connections = 8;
    o.connections.max_connections_per_address = 4;
  });
  ASSERT_NE(one.shard, nullptr);
  PsShard* shard = one.shard.get();
  const uint16_t port = PortOf(*shard);
  const std::vector<wire::TableShape> shapes = ShapesOf(*one.partition);
  RawClient good(shard->endpoint());  // from 127.0.0.1, and it sends
  auto reply = good.Exchange(PullOfTable0(*one.partition, 1, 1), shapes);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();

  // Six from one address: the first two go.
  std::vector<int> flood;
  for (int i = 0; i < 6; ++i) {
    flood.push_back(ConnectFrom("127.0.0.2", port));
    std::this_thread::sleep_for(5ms);  // accepted in this order
  }
  ASSERT_TRUE(Eventually([&] { return shard->refused_connections() == 2; }))
      << shard->refused_connections() << " shut";
  EXPECT_TRUE(ClosedWithin(flood[0], 2s));
  EXPECT_TRUE(ClosedWithin(flood[1], 2s));
  for (size_t i = 2; i < flood.size(); ++i) EXPECT_FALSE(ClosedWithin(flood[i], 50ms)) << i;
  EXPECT_EQ(shard->open_connections(), 5u);

  // The cap in all: 5 + 4 > 8, so the oldest silent one goes (127.0.0.2's
  // third), never the client that sends.
  std::vector<int> more;
  for (int i = 0; i < 4; ++i) {
    more.push_back(ConnectFrom("127.0.0.3", port));
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(Eventually([&] { return shard->refused_connections() == 3; }))
      << shard->refused_connections() << " shut";
  EXPECT_TRUE(ClosedWithin(flood[2], 2s));
  for (int fd : more) EXPECT_FALSE(ClosedWithin(fd, 50ms));
  auto again = good.Exchange(PullOfTable0(*one.partition, 2, 1), shapes);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->kind, wire::Kind::kPullReply) << again->error.ToString();

  // Closed connections give their slots back.
  for (int fd : flood) ::close(fd);
  for (int fd : more) ::close(fd);
  ASSERT_TRUE(Eventually([&] { return shard->open_connections() == 1; }))
      << shard->open_connections() << " open";
  shard->Stop();
}

// A hostile probe: a connection streaming the frames of a multipart
// message that never ends grew a shard to 617 MB and on (ZeroMQ keeps an
// unfinished message inside its pipe, where no ZeroMQ limit sees it).
TEST(ShardConnectionsTest, AMessageThatNeverEndsIsCutOff) {
  OneTableShard one = StartOneTableShard(1 << 10, Consistency::kAsync, [](ShardOptions& o) {
    o.connections.max_unread_bytes_per_connection = 8 << 20;
  });
  ASSERT_NE(one.shard, nullptr);
  PsShard* shard = one.shard.get();
  ZmtpPeer peer("127.0.0.2", PortOf(*shard));
  // Without the cut the shard holds all of it: at most 512 MiB, then fail.
  uint64_t streamed = 0;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline && shard->refused_connections() == 0 &&
         streamed < (uint64_t{512} << 20)) {
    if (!peer.Stream(1 << 20)) break;  // shut down: the peer reset
    streamed += 1 << 20;
  }
  EXPECT_TRUE(Eventually([&] { return shard->refused_connections() == 1; }))
      << "streamed " << streamed << " bytes of one unfinished message";
  // The bound, plus what arrives between two sweeps (10 ms: ~15 MB on this
  // loopback) and the sockets' buffers; generous for a loaded host.
  EXPECT_LT(streamed, uint64_t{256} << 20);
  EXPECT_TRUE(ClosedWithin(peer.fd(), 3s));
  // The shard serves on.
  RawClient good(shard->endpoint());
  auto reply = good.Exchange(PullOfTable0(*one.partition, 1, 1), ShapesOf(*one.partition));
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->kind, wire::Kind::kPullReply) << reply->error.ToString();
  shard->Stop();
}

// A hostile probe: a thousand unfinished messages, each below the bound of
// one connection, brought all of them to the bound in all; the shard then
// shut the largest holder, a worker whose push was in flight, and the job
// failed. Those whose last whole message is oldest go first now.
TEST(ShardConnectionsTest, PastTheBoundInAllTheLongestStuckGoFirst) {
  OneTableShard one = StartOneTableShard(1 << 10, Consistency::kAsync, [](ShardOptions& o) {
    o.connections.max_unread_bytes_per_connection = 64 << 20;
    o.connections.max_unread_bytes = 20 << 20;
  });
  ASSERT_NE(one.shard, nullptr);
  PsShard* shard = one.shard.get();
  const uint16_t port = PortOf(*shard);
  ZmtpPeer old_one("127.0.0.2", port), old_two("127.0.0.3", port);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(old_one.Stream(1 << 20));
    ASSERT_TRUE(old_two.Stream(1 << 20));
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(shard->refused_connections(), 0u) << "16 MiB in all is within the bound";
  // The newest holds the most (a big message in flight) and tips the total.
  ZmtpPeer newest("127.0.0.4", port);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(newest.Stream(1 << 20));
  ASSERT_TRUE(Eventually([&] { return shard->refused_connections() >= 1; }));
  EXPECT_TRUE(ClosedWithin(old_one.fd(), 2s));
  EXPECT_FALSE(ClosedWithin(newest.fd(), 200ms)) << "the newest holder was shut";
  shard->Stop();
}

// What a shard counts as taken from a connection is exactly what crossed
// the wire (wire::WireFrameBytes), so a connection's unread bytes do not
// drift with the messages it sends: 1 byte a frame too few would shut a
// worker down after a few million frames, 1 too many would let a peer bank
// credit for an unfinished message.
TEST(ShardConnectionsTest, WhatIsTakenMatchesTheWireExactly) {
  OneTableShard one = StartOneTableShard(1 << 10, Consistency::kAsync, [](ShardOptions&) {});
  ASSERT_NE(one.shard, nullptr);
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.connect(one.shard->endpoint());
  ASSERT_TRUE(ExchangeAssortedFrames(socket, 200));
  // What is left once the sweeps caught up (a loaded host delays them): the
  // ZMTP greeting and READY command (no message is unread). A count that
  // drifted would stay above the bound, or fall below the greeting. One
  // sweep may read 0: it reads a socket's bytes received before what was
  // taken, which by then may include a later message (the underestimate
  // connection_cap.cc allows), so the next sweeps are waited for.
  EXPECT_TRUE(Eventually([&] {
    const uint64_t unread = one.shard->largest_unread_bytes();
    return unread > 64u && unread < 200u;
  })) << one.shard->largest_unread_bytes()
      << " bytes unread; expected the greeting and READY, 65..199";
  one.shard->Stop();
}

}  // namespace
}  // namespace gridsync
