// A raw TCP connection to the coordinator for tests that must say what a
// hostile or broken client would: arbitrary bytes, length-prefixed flat
// Cap'n Proto frames, and the replies decoded by hand.
//
// Thread safety: one connection per test thread.
#pragma once

#include <arpa/inet.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "common/wire/gridsync.capnp.h"

namespace gridsync::testing {

class RawConnection {
  using Clock = std::chrono::steady_clock;

 public:
  explicit RawConnection(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    connected_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return connected_; }

  bool Send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;  // the server may already have closed: fine
      sent += static_cast<size_t>(n);
    }
    return true;
  }
  void ShutdownWrite() { ::shutdown(fd_, SHUT_WR); }

  enum class Outcome { kData, kEof, kTimeout };
  // Reads exactly n bytes into out, or reports EOF / timeout.
  Outcome Read(size_t n, std::string* out, Clock::time_point deadline) {
    out->clear();
    while (out->size() < n) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return Outcome::kTimeout;
      pollfd p{fd_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return Outcome::kTimeout;
      char buf[4096];
      ssize_t got = ::recv(fd_, buf, std::min(sizeof buf, n - out->size()), 0);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return Outcome::kEof;  // EOF or reset: closed either way
      out->append(buf, static_cast<size_t>(got));
    }
    return Outcome::kData;
  }

  struct Reply {
    bool eof = false;
    bool timeout = false;
    bool decoded = false;
    uint64_t request_id = 0;
    bool is_error = false;
    uint32_t code = 0;
    std::string text;
    std::string challenge;  // an authHello reply's bytes
  };
  // One reply frame, or EOF / timeout.
  Reply ReadReply(std::chrono::milliseconds timeout) {
    Reply reply;
    const auto deadline = Clock::now() + timeout;
    std::string header;
    auto outcome = Read(4, &header, deadline);
    if (outcome != Outcome::kData) {
      reply.eof = outcome == Outcome::kEof;
      reply.timeout = outcome == Outcome::kTimeout;
      return reply;
    }
    uint32_t length = 0;
    std::memcpy(&length, header.data(), 4);  // little-endian host (x86/ARM)
    if (length == 0 || length % 8 != 0 || length > (1u << 20)) return reply;
    std::string body;
    outcome = Read(length, &body, deadline);
    if (outcome != Outcome::kData) {
      reply.eof = outcome == Outcome::kEof;
      reply.timeout = outcome == Outcome::kTimeout;
      return reply;
    }
    try {
      std::vector<capnp::word> words(length / 8);
      std::memcpy(words.data(), body.data(), length);
      capnp::FlatArrayMessageReader reader(
          kj::ArrayPtr<const capnp::word>(words.data(), words.size()));
      auto root = reader.getRoot<wire::schema::CoordReply>();
      reply.request_id = root.getRequestId();
      reply.is_error = root.isError();
      if (reply.is_error) {
        reply.code = root.getError().getCode();
        reply.text = root.getError().getText().cStr();
      }
      if (root.isChallenge()) {
        auto c = root.getChallenge();
        reply.challenge.assign(reinterpret_cast<const char*>(c.begin()), c.size());
      }
      reply.decoded = true;
    } catch (const kj::Exception&) {
    }
    return reply;
  }

  // True once the server has closed the connection.
  bool WaitForClose(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    std::string sink;
    for (;;) {
      auto outcome = Read(1, &sink, deadline);
      if (outcome == Outcome::kEof) return true;
      if (outcome == Outcome::kTimeout) return false;
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

inline std::string LengthPrefix(uint32_t length) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return out;
}

inline std::string FrameOf(capnp::MessageBuilder& message) {
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return LengthPrefix(static_cast<uint32_t>(bytes.size())) +
         std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

}  // namespace gridsync::testing
