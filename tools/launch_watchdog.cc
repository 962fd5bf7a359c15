#include "tools/launch_watchdog.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "ops/service_watchdog.h"

namespace gridsync {

Result<std::unique_ptr<NotifySocket>> NotifySocket::Open(const std::string& name) {
  const std::string address = "@gridsync-launch-" + std::to_string(::getpid()) + "-" + name;
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError(std::string("notify socket: ") + std::strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // Abstract: a leading NUL instead of '@', no file to clean up.
  const size_t length = std::min(address.size(), sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path + 1, address.data() + 1, length - 1);
  const socklen_t size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + length);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), size) != 0) {
    const int error = errno;
    ::close(fd);
    return Status::IOError("notify socket " + address + ": " + std::strerror(error));
  }
  return std::unique_ptr<NotifySocket>(new NotifySocket(fd, address.substr(0, length)));
}

NotifySocket::~NotifySocket() { ::close(fd_); }

bool NotifySocket::Pinged() {
  bool pinged = false;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    if (n < 0) break;  // EAGAIN: nothing more
    const std::string_view text(buffer, static_cast<size_t>(n));
    // sd_notify's lines: "WATCHDOG=1", "READY=1\nSTATUS=...". READY=1
    // counts, as systemd's watchdog starts counting there: a server pings
    // first a third of the timeout after it, and a coordinator stopped in
    // that window was never watched, so never killed and restarted (a
    // hostile probe: the shards and workers spent their restarts on it).
    if (text.find("WATCHDOG=1") != std::string_view::npos ||
        text.find("READY=1") != std::string_view::npos)
      pinged = true;
  }
  return pinged;
}

std::chrono::milliseconds LaunchWatchdogTimeout(const Config& config) {
  const auto one_and_a_half =
      std::chrono::milliseconds(static_cast<int64_t>(config.distributed.timeout_s * 1500.0));
  return std::max(one_and_a_half, std::chrono::milliseconds(3000));
}

std::chrono::milliseconds LaunchStartTimeout(const Config& config, double option) {
  if (option > 0) return std::chrono::milliseconds(static_cast<int64_t>(option * 1000.0));
  return ServerStartTimeout(config.distributed.timeout_s);
}

std::chrono::milliseconds LaunchWorkerWatchdogTimeout(const Config& config) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      WorkerWatchdogTimeout(config.distributed.timeout_s));
}

}  // namespace gridsync
