#include "common/wire/connection_cap.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <zmq.h>

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
  events_.set(zmq::sockopt::rcvtimeo, 100);  // stop_ is checked this often
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
      if (!events_.recv(head)) continue;  // timeout: check stop_
      if (head.more()) (void)events_.recv(endpoint);
    } catch (const zmq::error_t&) {
      if (stop_) return;
      continue;
    }
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
  refused_.fetch_add(1, std::memory_order_relaxed);
  if (refusal_log_.Allow()) {
    spdlog::warn(
        "{}: refused a connection from {}: {} open ({} from that address); allowed: at most {} "
        "in all and {} from one address",
        who_, address, open, from_address, limits_.max_connections,
        limits_.max_connections_per_address);
  }
  // ZeroMQ owns the descriptor: shutting it down makes its engine read EOF
  // and close it, which reports the close that takes it off the counts.
  ::shutdown(fd, SHUT_RDWR);
}

void ConnectionCap::OnClosed(int fd) {
  const auto it = address_of_.find(fd);
  if (it == address_of_.end()) return;  // accepted before the monitor started
  const auto count = per_address_.find(it->second);
  if (count != per_address_.end() && --count->second == 0) per_address_.erase(count);
  address_of_.erase(it);
  open_.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace gridsync::wire
