// HandshakeWatch (handshake_watch.h).
//
// Thread safety: see handshake_watch.h.
#include "common/wire/handshake_watch.h"

#include <spdlog/fmt/fmt.h>
#include <zmq.h>

#include <atomic>
#include <cstring>

namespace gridsync::wire {
namespace {

std::atomic<uint64_t> next_watch{0};

constexpr int kWatched = ZMQ_EVENT_CONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                         ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                         ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

}  // namespace

Result<std::unique_ptr<HandshakeWatch>> HandshakeWatch::Attach(zmq::context_t& context,
                                                               zmq::socket_t& socket) {
  // Unique within the process: a process may hold many clients (the load
  // benchmark's simulated workers share one context).
  const std::string endpoint =
      "inproc://gridsync.handshakes." + std::to_string(next_watch.fetch_add(1));
  if (zmq_socket_monitor(socket.handle(), endpoint.c_str(), kWatched) != 0) {
    return Status::IOError(std::string("cannot monitor a socket's handshakes: ") +
                           zmq_strerror(zmq_errno()));
  }
  try {
    return std::unique_ptr<HandshakeWatch>(new HandshakeWatch(context, endpoint));
  } catch (const zmq::error_t& e) {
    return Status::IOError(std::string("cannot monitor a socket's handshakes: ") + e.what());
  }
}

HandshakeWatch::HandshakeWatch(zmq::context_t& context, const std::string& endpoint)
    : events_(context, zmq::socket_type::pair) {
  events_.set(zmq::sockopt::linger, 0);
  events_.connect(endpoint);
}

HandshakeWatch::~HandshakeWatch() = default;

bool HandshakeWatch::Poll() {
  bool failed = false;
  for (;;) {
    // An event is two frames: 2 bytes of event and 4 of value, then the
    // endpoint.
    zmq::message_t head, endpoint;
    try {
      if (!events_.recv(head, zmq::recv_flags::dontwait)) return failed;
      if (head.more()) (void)events_.recv(endpoint, zmq::recv_flags::dontwait);
    } catch (const zmq::error_t&) {
      return failed;
    }
    if (head.size() < 6) continue;
    uint16_t event = 0;
    int32_t value = 0;
    std::memcpy(&event, head.data(), sizeof(event));
    std::memcpy(&value, static_cast<const char*>(head.data()) + 2, sizeof(value));
    switch (event) {
      case ZMQ_EVENT_CONNECTED:
        ++connections_;
        // Bounded: a connection is made every 100 ms at most (ZeroMQ's
        // reconnect interval) and the owner takes them at every wait.
        if (connected_.size() < 64) connected_.push_back(value);
        break;
      case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        ++handshakes_;
        failed_last_ = false;
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        last_protocol_error_ = value;
        [[fallthrough]];
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) last_auth_status_ = value;
        [[fallthrough]];
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        ++failures_;
        failed_last_ = true;
        failed = true;
        break;
      default:
        break;
    }
  }
}

std::vector<int> HandshakeWatch::TakeConnected() {
  std::vector<int> taken;
  taken.swap(connected_);
  return taken;
}

std::string HandshakeWatch::Explain(const std::string& server, const std::string& key_file) const {
  if (handshakes_ > 0 && !failed_last_) return "";
  if (connections_ == 0) {
    return fmt::format(
        "no TCP connection to {} was ever made: check that it runs and listens "
        "there, and that nothing between the hosts drops the port",
        server);
  }
  if (failures_ == 0) {
    return fmt::format(
        "{} TCP connection(s) to {} were made but no handshake completed: it may "
        "not be a gridsync server, or it is too busy to answer",
        connections_, server);
  }
  const std::string counted =
      fmt::format("{} of {} connection(s) to {} failed their handshake and none completed since",
                  failures_, connections_, server);
  if (last_auth_status_ != 0) {
    return fmt::format(
        "{}: it refused this process's key (ZAP status {}); its security.keys_dir "
        "must hold this role's public key",
        counted, last_auth_status_);
  }
  if (last_protocol_error_ == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
    return fmt::format(
        "{}: it runs another security mechanism (one side has security.mode "
        "curve, the other none)",
        counted);
  }
  if (last_protocol_error_ != 0) {
    return fmt::format("{}: ZeroMQ protocol error 0x{:x}{}", counted, last_protocol_error_,
                       key_file.empty() ? "" : " (is " + key_file + " its public key?)");
  }
  if (key_file.empty()) {
    return fmt::format(
        "{}: it hung up mid-handshake (a connection cap, or it expects "
        "security.mode curve; its log names the reason)",
        counted);
  }
  return fmt::format(
      "{}: it hung up mid-handshake, which a CURVE server does when it cannot "
      "read the client's hello: {} here is likely not its public key (its log "
      "names the refusal)",
      counted, key_file);
}

}  // namespace gridsync::wire
