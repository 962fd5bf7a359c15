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

namespace gridsync::wire {
namespace {

// The peer's IP address, without the port: a peer opens many connections
// from one address, each from its own port.
std::string PeerAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t length = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) return "unknown";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) return text;
  } else if (addr.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof(text)) != nullptr) return text;
  } else if (addr.ss_family == AF_UNIX) {
    return "local";
  }
  return "unknown";
}

std::atomic<uint64_t> next_monitor{0};

}  // namespace

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
  if (zmq_socket_monitor(socket.handle(), endpoint.c_str(),
                         ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0) {
    return Status::IOError(who + ": cannot monitor its connections: " + zmq_strerror(zmq_errno()));
  }
  try {
    return std::unique_ptr<ConnectionCap>(new ConnectionCap(context, endpoint, limits, who));
  } catch (const zmq::error_t& e) {
    return Status::IOError(who + ": cannot monitor its connections: " + e.what());
  }
}

ConnectionCap::ConnectionCap(zmq::context_t& context, const std::string& monitor_endpoint,
                             const ConnectionLimits& limits, std::string who)
    : limits_(limits), who_(std::move(who)), events_(context, zmq::socket_type::pair) {
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
  }
}

void ConnectionCap::OnAccepted(int fd) {
  // A descriptor closed and reused before its events were read reports the
  // newer connection's address for both; its closed event then takes back
  // what this one counted, so the counts stay whole.
  if (address_of_.count(fd) != 0) OnClosed(fd);
  const std::string address = PeerAddress(fd);
  address_of_[fd] = address;
  const uint32_t from_address = ++per_address_[address];
  const uint32_t open = open_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (open <= limits_.max_connections && from_address <= limits_.max_connections_per_address) {
    return;
  }
  Shut(fd, fmt::format("a connection from {}: {} open ({} from that address); allowed: at most "
                       "{} in all and {} from one address",
                       address, open, from_address, limits_.max_connections,
                       limits_.max_connections_per_address));
}

void ConnectionCap::Shut(int fd, const std::string& why) {
  if (shut_.count(fd) != 0) return;
  shut_[fd] = true;
  refused_.fetch_add(1, std::memory_order_relaxed);
  if (refusal_log_.Allow()) spdlog::warn("{}: shut down {}", who_, why);
  // ZeroMQ owns the descriptor: shutting it down makes its engine read EOF
  // and close it (dropping what it held), which reports the close that
  // takes it off the counts.
  ::shutdown(fd, SHUT_RDWR);
}

void ConnectionCap::Taken(int fd, uint64_t bytes) {
  if (fd < 0) return;
  std::lock_guard<std::mutex> lock(taken_mu_);
  taken_[fd] += bytes;
}

void ConnectionCap::Sweep() {
  last_sweep_ = std::chrono::steady_clock::now();
  struct Held {
    int fd;
    uint64_t bytes;
  };
  std::vector<Held> held;
  uint64_t total = 0;
  {
    std::lock_guard<std::mutex> lock(taken_mu_);
    for (const auto& [fd, address] : address_of_) {
      if (shut_.count(fd) != 0) continue;
      tcp_info info{};
      socklen_t length = sizeof(info);
      if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0 ||
          length < offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received)) {
        continue;  // not TCP, or closed meanwhile
      }
      const auto it = taken_.find(fd);
      const uint64_t taken = it == taken_.end() ? 0 : it->second;
      const uint64_t unread =
          info.tcpi_bytes_received > taken ? info.tcpi_bytes_received - taken : 0;
      held.push_back({fd, unread});
      total += unread;
    }
  }
  uint64_t largest = 0;
  for (const Held& h : held) largest = std::max(largest, h.bytes);
  largest_unread_.store(largest, std::memory_order_relaxed);
  const uint64_t per = limits_.max_unread_bytes_per_connection;
  for (const Held& h : held) {
    if (per == 0 || h.bytes <= per) continue;
    Shut(h.fd, fmt::format("a connection from {}: it sent {} bytes not yet read as whole "
                           "messages (an unfinished multipart message); allowed: at most {}",
                           address_of_[h.fd], h.bytes, per));
    total -= h.bytes;
  }
  // All together past theirs: the largest holders go first.
  std::sort(held.begin(), held.end(),
            [](const Held& a, const Held& b) { return a.bytes > b.bytes; });
  for (const Held& h : held) {
    if (limits_.max_unread_bytes == 0 || total <= limits_.max_unread_bytes) break;
    if (shut_.count(h.fd) != 0) continue;
    Shut(h.fd, fmt::format("a connection from {}: connections hold {} bytes not yet read as whole "
                           "messages, this one {}, the most; allowed: at most {} in all",
                           address_of_[h.fd], total, h.bytes, limits_.max_unread_bytes));
    total -= h.bytes;
  }
}

void ConnectionCap::OnClosed(int fd) {
  const auto it = address_of_.find(fd);
  if (it == address_of_.end()) return;  // accepted before the monitor started
  const auto count = per_address_.find(it->second);
  if (count != per_address_.end() && --count->second == 0) per_address_.erase(count);
  address_of_.erase(it);
  shut_.erase(fd);
  {
    std::lock_guard<std::mutex> lock(taken_mu_);
    taken_.erase(fd);
  }
  open_.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace gridsync::wire
