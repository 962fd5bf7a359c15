#include "common/tcp_backoff.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace gridsync {
namespace {

// Debian 12's headers predate the option (linux/tcp.h of 6.15 and later).
#ifdef TCP_RTO_MAX_MS
constexpr int kTcpRtoMaxMs = TCP_RTO_MAX_MS;
#else
constexpr int kTcpRtoMaxMs = 44;
#endif

}  // namespace

std::string CapRetransmitBackoff(int fd, std::chrono::milliseconds cap) {
  const int ms = static_cast<int>(std::clamp<int64_t>(cap.count(), 1000, 120000));
  if (setsockopt(fd, IPPROTO_TCP, kTcpRtoMaxMs, &ms, sizeof(ms)) == 0) return {};
  return std::string("TCP_RTO_MAX_MS not set (a kernel before Linux 6.15 has none): ") +
         std::strerror(errno);
}

std::vector<int> OpenTcpSockets() {
  std::vector<int> fds;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    const std::string name = entry.path().filename().string();
    const auto [end, parse] = std::from_chars(name.data(), name.data() + name.size(), fd);
    if (parse != std::errc() || end != name.data() + name.size()) continue;
    int protocol = 0;
    socklen_t size = sizeof(protocol);
    // Not a socket (ENOTSOCK), or the iterator's own descriptor, gone.
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &size) != 0) continue;
    if (protocol == IPPROTO_TCP) fds.push_back(fd);
  }
  return fds;
}

int CapRetransmitBackoffOfOpenSockets(std::chrono::milliseconds cap) {
  int capped = 0;
  for (const int fd : OpenTcpSockets()) capped += CapRetransmitBackoff(fd, cap).empty() ? 1 : 0;
  return capped;
}

int RetransmitBackoffCapMs(int fd) {
  int ms = 0;
  socklen_t size = sizeof(ms);
  if (getsockopt(fd, IPPROTO_TCP, kTcpRtoMaxMs, &ms, &size) != 0) return -1;
  return ms;
}

}  // namespace gridsync
