// systemd's service watchdog for the processes `gridsync launch` starts: the
// coordinator and the shards send WATCHDOG=1 while their serving loops turn,
// the workers while they run (ops/service_watchdog.h); under systemd a unit that stops pinging is
// restarted (WatchdogSec=), and under the launcher nothing noticed (a
// hostile probe: a SIGSTOPped shard was never replaced; the launcher
// restarted the workers instead until --max-restarts ran out). Each
// watched child gets a notify socket of its own, as systemd gives each
// unit, so a ping names its sender without credentials.
//
// Thread safety: one thread (the launcher's loop) uses a socket.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/config.h"
#include "common/status.h"

namespace gridsync {

class NotifySocket {
 public:
  // An abstract AF_UNIX datagram socket, non-blocking, named after this
  // process and `name`.
  static Result<std::unique_ptr<NotifySocket>> Open(const std::string& name);
  ~NotifySocket();
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  // NOTIFY_SOCKET's value for the child ("@gridsync-launch-<pid>-<name>").
  const std::string& address() const { return address_; }
  // Reads every datagram that arrived; true when one held WATCHDOG=1 or
  // READY=1 (where systemd's watchdog starts counting).
  bool Pinged();

 private:
  NotifySocket(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  int fd_;
  std::string address_;
};

// How long a watched child may go without a ping: 1.5 x
// distributed.timeout_s, at least 3 s. Longer than a child's own waits on a
// peer (timeout_s), so those fail by themselves first; shorter than the
// workers' wait for the stuck server (a pull's timeout_s and its grace,
// then timeout_s for a restarted process to rejoin), so the replacement
// rejoins before they give up. A ping comes every third of it.
std::chrono::milliseconds LaunchWatchdogTimeout(const Config& config);
// How long a started child may go before its first sign of life (a
// server's READY=1, a worker's first ping), the launcher's TimeoutStartSec=:
// `option` seconds when it is > 0, else ServerStartTimeout
// (ops/service_watchdog.h: 90 s, or 3 x distributed.timeout_s if longer).
// Before it, a process frozen before READY=1 was never killed: the watchdog
// is armed by READY=1.
std::chrono::milliseconds LaunchStartTimeout(const Config& config, double option);
// A worker's: WorkerWatchdogTimeout (ops/service_watchdog.h), the one a
// worker under systemd retunes its unit's WatchdogSec= to.
std::chrono::milliseconds LaunchWorkerWatchdogTimeout(const Config& config);

}  // namespace gridsync
