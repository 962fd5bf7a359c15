// A ZeroMQ peer spoken by hand over a raw TCP socket, for tests that need
// what libzmq will not do: a message that never ends (libzmq sends nothing
// of a message before its last frame), or a peer that never reads what it
// is sent (a libzmq socket's I/O thread reads a whole reply into its pipe
// whatever the application does, so a reply "not read" drained out of the
// server at a pace set by the host's load).
//
// Thread safety: one thread per ZmtpPeer.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
#include <zmq.hpp>

namespace gridsync::testing_zmtp {

// A TCP connection to 127.0.0.1:port from `source` (any 127/8 address);
// `receive_buffer` bytes of kernel buffer when above 0 (set before the
// connect, so the window the server sees stays that small).
inline int ConnectFrom(const char* source, uint16_t port, int receive_buffer = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0 && receive_buffer > 0)
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
  sockaddr_in from{}, to{};
  from.sin_family = to.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  to.sin_port = htons(port);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    ADD_FAILURE() << "cannot connect from " << source << ": " << std::strerror(errno);
  }
  return fd;
}

// ZMTP 3.0, NULL mechanism, as a DEALER. It reads nothing the server sends.
class ZmtpPeer {
 public:
  ZmtpPeer(const char* source, uint16_t port, int receive_buffer = 0)
      : fd_(ConnectFrom(source, port, receive_buffer)) {
    timeval send_timeout{0, 200 * 1000};
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    // Greeting: signature, version 3.0, mechanism NULL, as-server 0, filler.
    std::string hello(64, '\0');
    hello[0] = '\xff';
    hello[9] = '\x7f';
    hello[10] = 3;
    hello.replace(12, 4, "NULL");
    // READY with Socket-Type DEALER (a short command frame).
    const std::string ready_body =
        std::string("\x05READY\x0bSocket-Type", 18) + std::string("\0\0\0\x06", 4) + "DEALER";
    hello += std::string(1, '\x04') + static_cast<char>(ready_body.size()) + ready_body;
    EXPECT_TRUE(SendAll(hello));
  }
  ~ZmtpPeer() { ::close(fd_); }
  ZmtpPeer(const ZmtpPeer&) = delete;
  ZmtpPeer& operator=(const ZmtpPeer&) = delete;
  int fd() const { return fd_; }

  // Reads the server's greeting and READY (and nothing after them), within
  // 5 s: a message sent before the server sent its READY is refused as an
  // unexpected command. false when they did not come.
  bool AwaitReady() {
    std::string got;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (got.size() < 64 || got.find("READY", 64) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char byte = 0;  // one at a time: nothing past the READY is taken
      const ssize_t n = ::recv(fd_, &byte, 1, 0);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return false;
      if (n == 1) got += byte;
    }
    // The READY command's properties follow its name: read to its end.
    const size_t at = got.find("READY", 64);
    const size_t size_at = at - 2;  // flags, then a short size, then "\x05READY"
    const size_t end = size_at + 1 + static_cast<uint8_t>(got[size_at]);
    while (got.size() < end) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char byte = 0;
      const ssize_t n = ::recv(fd_, &byte, 1, 0);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return false;
      if (n == 1) got += byte;
    }
    return true;
  }

  // One more frame of `bytes`, saying more follows (a long frame: flags
  // 0x03). false once the server shut the connection down.
  bool Stream(uint64_t bytes) { return SendAll(Frame(std::string(bytes, 'x'), true)); }

  // A whole message of these frames, as a DEALER sends it (no delimiter);
  // false unless all of it was sent within the send timeout.
  bool SendMessage(const std::vector<zmq::message_t>& frames) {
    std::string bytes;
    for (size_t i = 0; i < frames.size(); ++i) {
      bytes += Frame(std::string(static_cast<const char*>(frames[i].data()), frames[i].size()),
                     i + 1 < frames.size());
    }
    return SendAll(bytes, /*whole=*/true);
  }

 private:
  static std::string Frame(const std::string& body, bool more) {
    const uint64_t n = body.size();
    std::string frame(1, static_cast<char>(0x02 | (more ? 0x01 : 0x00)));  // always long
    for (int i = 0; i < 8; ++i) frame += static_cast<char>(n >> (56 - 8 * i));
    return frame + body;
  }
  // whole: false when the server stops reading before the end (else that
  // ends the send, true: a stream that stalls is what some tests make).
  bool SendAll(const std::string& bytes, bool whole = false) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return !whole;  // the server is not reading: stop here
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }
  const int fd_;
};

}  // namespace gridsync::testing_zmtp
