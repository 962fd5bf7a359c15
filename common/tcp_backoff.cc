#include "common/tcp_backoff.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace gridsync {
namespace {

#if defined(__linux__)
// Debian 12's headers predate the option (linux/tcp.h of 6.15 and later).
#ifdef TCP_RTO_MAX_MS
constexpr int kTcpRtoMaxMs = TCP_RTO_MAX_MS;
#else
constexpr int kTcpRtoMaxMs = 44;
#endif
#endif

}  // namespace

std::chrono::milliseconds UncappedGiveUp(int retries) {
  // tcp_model_timeout: the timer doubles from TCP_RTO_MIN until it would
  // pass TCP_RTO_MAX, then stays there.
  constexpr int64_t kMinMs = 200, kMaxMs = 120000;
  int doublings = 0;  // ilog2(kMaxMs / kMinMs)
  while ((kMinMs << (doublings + 1)) <= kMaxMs) ++doublings;
  const int64_t n = std::max(retries, 0);
  if (n <= doublings) return std::chrono::milliseconds(((int64_t{2} << n) - 1) * kMinMs);
  return std::chrono::milliseconds(((int64_t{2} << doublings) - 1) * kMinMs +
                                   (n - doublings) * kMaxMs);
}

std::chrono::milliseconds UncappedGiveUp() {
  int retries = 15;
  std::ifstream in("/proc/sys/net/ipv4/tcp_retries2");
  if (!(in >> retries)) retries = 15;
  return UncappedGiveUp(retries);
}

std::string CapRetransmitBackoff(int fd) {
#if defined(__linux__)
  const int cap_ms = static_cast<int>(kRetransmitBackoffCap.count());
  if (setsockopt(fd, IPPROTO_TCP, kTcpRtoMaxMs, &cap_ms, sizeof(cap_ms)) != 0) {
    const int error = errno;
    return std::string("TCP_RTO_MAX_MS not set: ") + std::strerror(error) +
           (error == ENOPROTOOPT ? " (Linux 6.15 added it)" : "");
  }
  unsigned user_timeout_ms = 0;
  socklen_t size = sizeof(user_timeout_ms);
  if (getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, &size) != 0) {
    return std::string("TCP_USER_TIMEOUT not read: ") + std::strerror(errno);
  }
  if (user_timeout_ms != 0) return {};  // the owner's (the coordinator's dead_peer_after)
  user_timeout_ms = static_cast<unsigned>(UncappedGiveUp().count());
  if (setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms)) !=
      0) {
    return std::string("TCP_USER_TIMEOUT not set: ") + std::strerror(errno);
  }
  return {};
#else
  (void)fd;
  return "TCP_RTO_MAX_MS is Linux's";
#endif
}

int RetransmitBackoffCapMs(int fd) {
#if defined(__linux__)
  int ms = 0;
  socklen_t size = sizeof(ms);
  if (getsockopt(fd, IPPROTO_TCP, kTcpRtoMaxMs, &ms, &size) != 0) return -1;
  return ms;
#else
  (void)fd;
  return -1;
#endif
}

}  // namespace gridsync
