// A TCP socket of the test's own on 127.0.0.1, on a port the kernel picks:
// a port that is taken (held listening), or one nothing listens on (closed
// at once), for tests that need either.
//
// Thread safety: plain functions.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace gridsync::testing {

// A socket listening on 127.0.0.1 with `backlog` (the kernel accepts that
// many connections nobody serves); its port into *port. -1 (and a test
// failure) when it cannot be made. The caller closes it.
inline int ListenOnLoopback(uint16_t* port, int backlog = 4) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool made = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                    ::listen(fd, backlog) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  EXPECT_TRUE(made) << "cannot listen on 127.0.0.1";
  if (!made) {
    ::close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

// A port nothing listens on (bound once, then released).
inline uint16_t UnusedPort() {
  uint16_t port = 0;
  if (const int fd = ListenOnLoopback(&port); fd >= 0) ::close(fd);
  return port;
}

}  // namespace gridsync::testing
