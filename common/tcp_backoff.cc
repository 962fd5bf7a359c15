#include "common/tcp_backoff.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

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
  constexpr int doublings = 9;  // ilog2(kMaxMs / kMinMs)
  static_assert((kMinMs << doublings) <= kMaxMs && (kMinMs << (doublings + 1)) > kMaxMs);
  const int64_t n = std::max(retries, 0);
  if (n <= doublings) return std::chrono::milliseconds(((int64_t{2} << n) - 1) * kMinMs);
  return std::chrono::milliseconds(((int64_t{2} << doublings) - 1) * kMinMs +
                                   (n - doublings) * kMaxMs);
}

std::chrono::milliseconds UncappedGiveUp() {
  // Read once: a host's tcp_retries2 is set at boot, and every capped
  // connection would otherwise read the file again.
  static const std::chrono::milliseconds give_up = [] {
    int retries = 15;
    std::ifstream in("/proc/sys/net/ipv4/tcp_retries2");
    if (!(in >> retries)) retries = 15;
    return UncappedGiveUp(retries);
  }();
  return give_up;
}

std::chrono::milliseconds RetransmitCapFor(std::chrono::milliseconds timeout) {
  return std::max<std::chrono::milliseconds>(kRetransmitBackoffCap,
                                             (timeout + std::chrono::milliseconds(11)) / 12);
}

std::vector<OpenTcpSocket> OpenTcpSockets() {
  std::vector<OpenTcpSocket> sockets;
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/self/fd", ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int fd = -1;
    const auto [last, parse] = std::from_chars(name.data(), name.data() + name.size(), fd);
    if (parse != std::errc() || last != name.data() + name.size()) continue;
    // "socket:[inode]"; the iterator's own descriptor and anything closed
    // meanwhile fail here or below.
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(it->path(), link_ec).string();
    uint64_t inode = 0;
    if (link_ec || target.rfind("socket:[", 0) != 0 ||
        std::from_chars(target.data() + 8, target.data() + target.size(), inode).ec !=
            std::errc()) {
      continue;
    }
    int protocol = 0;
    socklen_t size = sizeof(protocol);
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &size) != 0) continue;
    if (protocol == IPPROTO_TCP) sockets.push_back({fd, inode});
  }
  return sockets;
}

std::string CapRetransmitBackoff(int fd, std::chrono::milliseconds cap) {
#if defined(__linux__)
  const int cap_ms = static_cast<int>(std::clamp<int64_t>(cap.count(), 1000, 120000));
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
