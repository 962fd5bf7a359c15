// A cap on the TCP connections a listening ZeroMQ socket holds, in all and
// per peer address. ZeroMQ accepts every connection and keeps each one's
// buffers (about 90 KiB) whatever the application does: a hostile probe
// opened 10,500 connections to a shard and grew it to 968 MB. A socket
// monitor reports each accepted and each closed connection; past either
// cap the new connection is shut down at once (its peer reads EOF), and
// the connections already served keep their slots. Without CURVE nothing
// else stands between a peer and the shard's memory, and with CURVE a
// connection holds its buffers during the handshake too.
//
// Thread safety: the constructor attaches the monitor to a socket that is
// not bound yet and not used by another thread meanwhile; the cap serves
// on its own thread, and the destructor stops it. Counters are atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "common/logging.h"
#include "common/status.h"

namespace gridsync::wire {

struct ConnectionLimits {
  uint32_t max_connections = 1024;             // in all
  uint32_t max_connections_per_address = 256;  // from one peer address
};

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

  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  uint32_t open() const { return open_.load(std::memory_order_relaxed); }

 private:
  ConnectionCap(zmq::context_t& context, const std::string& monitor_endpoint,
                const ConnectionLimits& limits, std::string who);
  void Serve();
  void OnAccepted(int fd);
  void OnClosed(int fd);

  const ConnectionLimits limits_;
  const std::string who_;
  zmq::socket_t events_;  // the monitor's PAIR end
  // The serving thread's: each open connection's descriptor and address,
  // and the open connections per address.
  std::map<int, std::string> address_of_;
  std::map<std::string, uint32_t> per_address_;
  LogBudget refusal_log_{"refused connections"};
  std::atomic<uint32_t> open_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace gridsync::wire
