#include "common/wire/connection_cap.h"

#include <arpa/inet.h>
#include <linux/tcp.h>  // tcp_info with tcpi_bytes_received (glibc's lacks it)
#include <netinet/in.h>
#include <spdlog/fmt/fmt.h>
#include <sys/socket.h>
#include <zmq.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "common/tcp_backoff.h"

namespace gridsync::wire {
namespace {

// The peer's IP address, with its port or without: a peer opens many
// connections from one address, each from its own port.
std::string PeerAddress(int fd, bool with_port = false) {
  sockaddr_storage addr{};
  socklen_t length = sizeof(addr);
  // getpeername fails once the connection is gone (ENOTCONN), closed by
  // the peer (a port scan) or by ZeroMQ (a refused handshake) before this
  // monitor event was read.
  if (fd < 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0)
    return "unknown (the connection was closed before its address was read)";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) {
      return with_port ? std::string(text) + ":" + std::to_string(ntohs(in->sin_port)) : text;
    }
  } else if (addr.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&addr);
    // A dual-stack socket reports an IPv4 peer as ::ffff:a.b.c.d: named as
    // the IPv4 address it is.
    if (IN6_IS_ADDR_V4MAPPED(&in->sin6_addr) &&
        inet_ntop(AF_INET, in->sin6_addr.s6_addr + 12, text, sizeof(text)) != nullptr) {
      return with_port ? std::string(text) + ":" + std::to_string(ntohs(in->sin6_port)) : text;
    }
    if (inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof(text)) != nullptr) {
      return with_port ? "[" + std::string(text) + "]:" + std::to_string(ntohs(in->sin6_port))
                       : text;
    }
  } else if (addr.ss_family == AF_UNIX) {
    return "local";
  }
  return "unknown";
}

std::atomic<uint64_t> next_monitor{0};

}  // namespace

std::string PeerOfConnection(int fd) { return PeerAddress(fd, /*with_port=*/true); }

Result<std::unique_ptr<ConnectionCap>> ConnectionCap::Attach(zmq::context_t& context,
                                                             zmq::socket_t& socket,
                                                             const ConnectionLimits& limits,
                                                             std::string who) {
  if (limits.max_connections == 0 || limits.max_connections_per_address == 0) {
    return Status::InvalidArgument(who + ": connection caps must be at least 1");
  }
  // Unique within the process: several shards may share one (tests,
  // in-process clusters).
  const std::string endpoint =
      "inproc://gridsync.connections." + std::to_string(next_monitor.fetch_add(1));
  // Handshakes that failed on the protocol: a peer that hung up
  // mid-handshake, or one shut down here past a cap (NO_DETAIL), is no
  // refusal of its own.
  if (zmq_socket_monitor(
          socket.handle(), endpoint.c_str(),
          ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0) {
    return Status::IOError(who + ": cannot monitor its connections: " + zmq_strerror(zmq_errno()));
  }
  int mechanism = ZMQ_NULL;
  size_t mechanism_size = sizeof(mechanism);
  if (zmq_getsockopt(socket.handle(), ZMQ_MECHANISM, &mechanism, &mechanism_size) != 0)
    mechanism = ZMQ_NULL;
  try {
    return std::unique_ptr<ConnectionCap>(
        new ConnectionCap(context, endpoint, limits, who, mechanism == ZMQ_CURVE));
  } catch (const zmq::error_t& e) {
    return Status::IOError(who + ": cannot monitor its connections: " + e.what());
  }
}

ConnectionCap::ConnectionCap(zmq::context_t& context, const std::string& monitor_endpoint,
                             const ConnectionLimits& limits, std::string who, bool curve_server)
    : limits_(limits),
      who_(std::move(who)),
      curve_server_(curve_server),
      events_(context, zmq::socket_type::pair) {
  events_.set(zmq::sockopt::linger, 0);
  events_.set(zmq::sockopt::rcvtimeo, 10);  // stop_ and the sweep are checked this often
  events_.connect(monitor_endpoint);
  thread_ = std::thread([this] { Serve(); });
}

ConnectionCap::~ConnectionCap() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ConnectionCap::Serve() {
  while (!stop_) {
    // An event is two frames: 2 bytes of event, 4 of value (the
    // descriptor), then the endpoint.
    zmq::message_t head, endpoint;
    try {
      if (!events_.recv(head)) {  // timeout: check stop_
        if (std::chrono::steady_clock::now() - last_sweep_ >= SweepInterval()) Sweep();
        continue;
      }
      if (head.more()) (void)events_.recv(endpoint);
    } catch (const zmq::error_t&) {
      if (stop_) return;
      continue;
    }
    if (std::chrono::steady_clock::now() - last_sweep_ >= SweepInterval()) Sweep();
    if (head.size() < 6) continue;
    uint16_t event = 0;
    int32_t value = 0;
    std::memcpy(&event, head.data(), sizeof(event));
    std::memcpy(&value, static_cast<const char*>(head.data()) + 2, sizeof(value));
    if (event == ZMQ_EVENT_ACCEPTED) OnAccepted(value);
    if (event == ZMQ_EVENT_DISCONNECTED) OnClosed(value);
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) OnHandshakeFailed(value);
  }
}

namespace {

// What ZeroMQ's handshake error codes mean to whoever set the peer up.
std::string HandshakeProblem(int code, bool curve_server) {
  switch (code) {
    case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
      // ZeroMQ does not say which mechanism the peer offered: NULL, PLAIN
      // or bytes of no mechanism at all.
      return curve_server
                 ? "it does not offer CURVE, which this server requires (security.mode curve): "
                   "a client without security.mode curve, or not a gridsync client"
                 : "it offers a security mechanism this server does not run (security.mode off: "
                   "none): a client with security.mode curve, or not a gridsync client";
    case ZMQ_PROTOCOL_ERROR_ZMTP_UNSPECIFIED:
    case ZMQ_PROTOCOL_ERROR_ZMTP_UNEXPECTED_COMMAND:
    case ZMQ_PROTOCOL_ERROR_ZMTP_INVALID_SEQUENCE:
    case ZMQ_PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE:
    case ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_UNSPECIFIED:
    case ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_MESSAGE:
    case ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_HELLO:
    case ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_INITIATE:
    case ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_ERROR:
    case ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_READY:
    case ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_WELCOME:
    case ZMQ_PROTOCOL_ERROR_ZMTP_INVALID_METADATA:
      return fmt::format("a malformed or unexpected ZMTP handshake (protocol error 0x{:x})", code);
    case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
      return "its CURVE handshake does not verify (a wrong server key: security.keys_dir's "
             "shard.pub)";
    default:
      return fmt::format("ZeroMQ protocol error 0x{:x}", code);
  }
}

}  // namespace

void ConnectionCap::OnHandshakeFailed(int code) {
  // ZeroMQ names the listening endpoint, not the peer: the reason waits
  // for the connection's closing, which follows it (one connection's
  // events come in order), to be logged with the peer's address: the next
  // connection to close without a whole message, which is that one unless
  // another closed as quietly in between.
  refused_.fetch_add(1, std::memory_order_relaxed);
  if (handshake_failures_.size() < 64)
    handshake_failures_.push_back(HandshakeProblem(code, curve_server_));
}

void ConnectionCap::OnAccepted(int fd) {
  // A descriptor closed and reused before its events were read reports the
  // newer connection's address for both; its closed event then takes back
  // what this one counted, so the counts stay whole.
  if (open_at_.count(fd) != 0) OnClosed(fd);
  const auto now = Clock::now();
  {
    // Messages taken on this descriptor before this event are this
    // connection's own first ones, and count, unless an earlier connection
    // on it closed: then they may be that one's, read after it closed, and
    // must not be banked as credit for an unfinished message, so the count
    // starts afresh (this one's first messages then count as unread). That
    // was done on every accept, and a loaded host, reading this event
    // after a connection's first exchanges, left it 70 KB unread for good
    // (a connection that must not drift).
    std::lock_guard<std::mutex> lock(taken_mu_);
    if (closed_fds_.erase(fd) != 0 || taken_.count(fd) == 0) taken_[fd] = Progress{0, 0, now};
  }
  const std::string address = PeerAddress(fd);
  if (limits_.retransmit_cap.count() > 0) {
    if (const std::string why = CapRetransmitBackoff(fd, limits_.retransmit_cap); !why.empty())
      spdlog::debug("{}: a connection from {} keeps TCP's backoff: {}", who_, address, why);
  }
  open_at_[fd] = Open{address, now, false};
  const uint32_t from_address = ++per_address_[address];
  const uint32_t open = open_.fetch_add(1, std::memory_order_relaxed) + 1;
  const bool address_full = from_address > limits_.max_connections_per_address;
  if (!address_full && open <= limits_.max_connections) return;
  const std::string why = fmt::format(
      "{} open ({} from {}); allowed: at most {} in all and {} from one address", open,
      from_address, address, limits_.max_connections, limits_.max_connections_per_address);
  std::string idle;
  if (const int victim = Evictable(fd, address_full ? address : std::string(), &idle);
      victim >= 0) {
    Shut(victim,
         fmt::format("a connection from {} to make room for a new one ({}): {}",
                     open_at_.at(victim).address, idle, why),
         cap_log_);
    return;
  }
  Shut(fd, fmt::format("a new connection from {}: {}", address, why), cap_log_);
}

int ConnectionCap::Evictable(int fresh, const std::string& address, std::string* idle_for) {
  const auto now = Clock::now();
  int silent = -1, idle = -1;
  Clock::time_point silent_since{}, idle_since{};
  std::lock_guard<std::mutex> lock(taken_mu_);  // rare: only past a cap
  for (const auto& [fd, conn] : open_at_) {
    if (fd == fresh || conn.shut || (!address.empty() && conn.address != address)) continue;
    const auto it = taken_.find(fd);
    const Progress p = it == taken_.end() ? Progress{0, 0, conn.accepted} : it->second;
    if (p.messages == 0) {
      if (silent < 0 || conn.accepted < silent_since) silent = fd, silent_since = conn.accepted;
    } else if (now - p.last >= limits_.idle_after) {
      if (idle < 0 || p.last < idle_since) idle = fd, idle_since = p.last;
    }
  }
  auto ms = [&](Clock::time_point since) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(now - since).count();
  };
  if (silent >= 0) {
    *idle_for = fmt::format("no whole message since it connected {} ms ago", ms(silent_since));
    return silent;
  }
  if (idle >= 0) {
    *idle_for = fmt::format("no whole message for {} ms; allowed idle: {} ms", ms(idle_since),
                            limits_.idle_after.count());
  }
  return idle;
}

void ConnectionCap::Shut(int fd, const std::string& why, LogBudget& log) {
  const auto it = open_at_.find(fd);
  if (it == open_at_.end() || it->second.shut) return;
  it->second.shut = true;
  refused_.fetch_add(1, std::memory_order_relaxed);
  if (log.Allow()) spdlog::warn("{}: shut down {}", who_, why);
  // ZeroMQ owns the descriptor: shutting it down makes its engine read EOF
  // and close it (dropping what it held), which reports the close that
  // takes it off the counts.
  ::shutdown(fd, SHUT_RDWR);
}

void ConnectionCap::Taken(int fd, uint64_t bytes) {
  if (fd < 0) return;
  std::lock_guard<std::mutex> lock(taken_mu_);
  Progress& p = taken_[fd];
  p.bytes += bytes;
  ++p.messages;
  p.last = Clock::now();
}

void ConnectionCap::Sweep() {
  last_sweep_ = Clock::now();
  cap_log_.Tick();
  unread_log_.Tick();
  handshake_log_.Tick();
  struct Held {
    int fd;
    uint64_t bytes;
    Clock::time_point last;  // the last whole message
  };
  // Each socket's bytes received first, without the lock (the serving
  // loop takes it for every message); then what was taken, which may by
  // then include a later message: unread is at worst underestimated for a
  // sweep, never a worker's in-flight bytes counted twice.
  struct Received {
    int fd;
    uint64_t bytes;
    Clock::time_point accepted;
  };
  std::vector<Received> received;
  received.reserve(open_at_.size());
  for (const auto& [fd, conn] : open_at_) {
    if (conn.shut) continue;
    tcp_info info{};
    socklen_t length = sizeof(info);
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0 ||
        length < offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received)) {
      continue;  // not TCP, or closed meanwhile
    }
    received.push_back({fd, info.tcpi_bytes_received, conn.accepted});
  }
  std::vector<Held> held;
  held.reserve(received.size());
  uint64_t total = 0;
  {
    std::lock_guard<std::mutex> lock(taken_mu_);
    for (const auto& [fd, bytes, accepted] : received) {
      const auto it = taken_.find(fd);
      const Progress p = it == taken_.end() ? Progress{0, 0, accepted} : it->second;
      const uint64_t unread = bytes > p.bytes ? bytes - p.bytes : 0;
      held.push_back({fd, unread, p.last});
      total += unread;
    }
  }
  uint64_t largest = 0;
  for (const Held& h : held) largest = std::max(largest, h.bytes);
  largest_unread_.store(largest, std::memory_order_relaxed);
  const uint64_t per = limits_.max_unread_bytes_per_connection;
  for (const Held& h : held) {
    if (per == 0 || h.bytes <= per) continue;
    Shut(h.fd,
         fmt::format("a connection from {}: it sent {} bytes not yet read as whole messages (an "
                     "unfinished multipart message); allowed: at most {}",
                     open_at_.at(h.fd).address, h.bytes, per),
         unread_log_);
    total -= h.bytes;
  }
  if (limits_.max_unread_bytes == 0 || total <= limits_.max_unread_bytes) return;
  // All together past theirs: those stuck longest go first (see the header).
  constexpr uint64_t kHolding = 64 << 10;
  std::sort(held.begin(), held.end(), [](const Held& a, const Held& b) { return a.last < b.last; });
  const auto now = Clock::now();
  for (const Held& h : held) {
    if (total <= limits_.max_unread_bytes) break;
    if (h.bytes <= kHolding || open_at_.at(h.fd).shut) continue;
    Shut(h.fd,
         fmt::format("a connection from {}: connections hold {} bytes not yet read as whole "
                     "messages, this one {} with no whole message for {} ms, the longest; "
                     "allowed: at most {} in all",
                     open_at_.at(h.fd).address, total, h.bytes,
                     std::chrono::duration_cast<std::chrono::milliseconds>(now - h.last).count(),
                     limits_.max_unread_bytes),
         unread_log_);
    total -= h.bytes;
  }
}

void ConnectionCap::OnClosed(int fd) {
  const auto it = open_at_.find(fd);
  if (it == open_at_.end()) return;  // accepted before the monitor started
  if (!handshake_failures_.empty()) {
    uint64_t messages = 0;
    {
      std::lock_guard<std::mutex> lock(taken_mu_);
      if (const auto t = taken_.find(fd); t != taken_.end()) messages = t->second.messages;
    }
    if (messages == 0) {
      if (handshake_log_.Allow()) {
        spdlog::warn(
            "{}: refused a connection from {} in its handshake: {}; allowed: peers "
            "with this cluster's security settings (security.mode, keys_dir)",
            who_, it->second.address, handshake_failures_.front());
      }
      handshake_failures_.pop_front();
    }
  }
  const auto count = per_address_.find(it->second.address);
  if (count != per_address_.end() && --count->second == 0) per_address_.erase(count);
  open_at_.erase(it);
  {
    std::lock_guard<std::mutex> lock(taken_mu_);
    taken_.erase(fd);
  }
  closed_fds_.insert(fd);
  open_.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace gridsync::wire
