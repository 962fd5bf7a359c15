// Caps on what the connections to a listening ZeroMQ socket make its
// process hold.
// - Connections, in all and per peer address. ZeroMQ accepts every
//   connection and keeps each one's buffers (about 90 KiB) whatever the
//   application does: a hostile probe opened 10,500 connections to a shard
//   and grew it to 968 MB. A socket monitor reports each accepted and each
//   closed connection. Past either cap a connection is shut down at once
//   (its peer reads EOF): one that never sent a whole message, the oldest
//   first, else one idle for `idle_after`, the longest idle first, else the
//   new one. Refusing the new one always let connections held open lock a
//   restarted worker out; the serving workers send every step, so they are
//   neither.
// - Bytes a connection delivered that the application has not taken as
//   whole messages. ZeroMQ keeps the frames of an unfinished multipart
//   message inside its pipe, where neither ZMQ_MAXMSGSIZE (a frame's
//   bound) nor the high-water mark (which counts whole messages) sees
//   them: one connection streaming frames that never end grew a shard to
//   617 MB and on. Every 10 ms the bytes each connection's TCP socket
//   received (TCP_INFO) are set against what the application took from it
//   (Taken, by the descriptor ZMQ_SRCFD names); a connection past its
//   bound is shut down, and while all of them together are past theirs,
//   those holding more than 64 KiB whose last whole message is oldest
//   (an unfinished message stops a connection's messages; a worker's
//   in-flight push is younger than its previous step). Shutting the
//   largest holder first cut off a worker whose push came just after a
//   thousand unfinished messages had brought the total to its bound.
// Without CURVE nothing else stands between a peer and the process's
// memory; with CURVE no bytes pass before the key, but a connection holds
// its buffers during the handshake.
//
// Thread safety: Attach runs on a socket that is not bound yet and not used
// by another thread meanwhile; the cap serves on its own thread, and the
// destructor stops it. Taken may be called from any thread; counters are
// atomic.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "common/logging.h"
#include "common/status.h"

namespace gridsync::wire {

struct ConnectionLimits {
  uint32_t max_connections = 1024;             // in all
  uint32_t max_connections_per_address = 256;  // from one peer address
  // Bytes received and not yet taken as whole messages: per connection,
  // and over all of them. 0: unbounded.
  uint64_t max_unread_bytes_per_connection = 0;
  uint64_t max_unread_bytes = 0;
  // A connection that sent no whole message for this long may be shut
  // down to make room (past the connection caps).
  std::chrono::milliseconds idle_after{30000};
  // Each accepted connection's TCP retransmission timer is capped at this
  // (common/tcp_backoff.h; 0: the kernel's backoff, up to 120 s), so that
  // data a short outage held up is resent soon after the link's return.
  std::chrono::milliseconds retransmit_cap{0};
};

// The peer of TCP connection `fd` as "address:port" (ZMQ_SRCFD names it
// for a received message), for a log line about what it sent: "unknown"
// where it has gone or the descriptor is none (-1).
std::string PeerOfConnection(int fd);

class ConnectionCap {
 public:
  // Monitors `socket` (before its bind) within `context`; `who` names the
  // process in log lines ("shard 0").
  static Result<std::unique_ptr<ConnectionCap>> Attach(zmq::context_t& context,
                                                       zmq::socket_t& socket,
                                                       const ConnectionLimits& limits,
                                                       std::string who);
  ~ConnectionCap();
  ConnectionCap(const ConnectionCap&) = delete;
  ConnectionCap& operator=(const ConnectionCap&) = delete;

  // The application took a message of about `bytes` wire bytes from the
  // connection on descriptor `fd` (wire::TakenBytes).
  void Taken(int fd, uint64_t bytes);

  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  uint32_t open() const { return open_.load(std::memory_order_relaxed); }
  // The most unread bytes one connection held at the last sweep (its
  // handshake's bytes included: about 100, or 500 under CURVE).
  uint64_t largest_unread() const { return largest_unread_.load(std::memory_order_relaxed); }

 private:
  ConnectionCap(zmq::context_t& context, const std::string& monitor_endpoint,
                const ConnectionLimits& limits, std::string who, bool curve_server);
  void Serve();
  void OnAccepted(int fd);
  void OnClosed(int fd);
  // A peer's handshake failed on ZMTP protocol error `code`: counted, and
  // logged with its address when its connection closes.
  void OnHandshakeFailed(int code);
  // Shuts down the connections that hold more unread bytes than allowed.
  void Sweep();
  // Every 10 ms, or 20 us a connection when more are open (one getsockopt
  // each): what arrives in between passes the bound unseen (~15 MB on
  // loopback at 10 ms).
  std::chrono::microseconds SweepInterval() const {
    return std::chrono::microseconds(std::max<uint64_t>(10000, 20 * uint64_t{open()}));
  }
  void Shut(int fd, const std::string& why, LogBudget& log);
  // The connection to shut down for a new one (`fresh`) past a cap, among
  // those from `address` (empty: all), or -1: see the header's comment.
  // *idle_for says how long it sent nothing.
  int Evictable(int fresh, const std::string& address, std::string* idle_for);

  using Clock = std::chrono::steady_clock;
  // What the application took from a connection (guarded by taken_mu_).
  struct Progress {
    uint64_t bytes = 0;
    uint64_t messages = 0;
    Clock::time_point last;  // of the last whole message, or the accept
  };
  struct Open {
    std::string address;
    Clock::time_point accepted;
    bool shut = false;  // shut down, not yet reported closed
  };

  const ConnectionLimits limits_;
  const std::string who_;
  // The socket's mechanism at Attach: a peer of another one is told apart
  // by which side runs CURVE.
  const bool curve_server_;
  zmq::socket_t events_;  // the monitor's PAIR end
  // The serving thread's: each open connection, by descriptor, and the
  // open connections per address.
  std::map<int, Open> open_at_;
  // Descriptors whose connection closed and that no connection has been
  // accepted on since: what is taken on them may be the closed one's.
  std::set<int> closed_fds_;
  std::map<std::string, uint32_t> per_address_;
  Clock::time_point last_sweep_{};
  std::mutex taken_mu_;
  std::map<int, Progress> taken_;  // guarded by taken_mu_
  // Separate budgets: a flood of one kind must not hide the other's lines.
  LogBudget cap_log_{"connections shut down past the connection caps"};
  LogBudget unread_log_{"connections shut down for unread bytes"};
  LogBudget handshake_log_{"connections refused in their handshake"};
  std::deque<std::string> handshake_failures_;  // reasons awaiting their connection's close
  std::atomic<uint32_t> open_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> largest_unread_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace gridsync::wire
