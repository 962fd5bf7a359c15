// systemd's service watchdog (WatchdogSec=), fed by a serving loop's
// progress: the process sends WATCHDOG=1 only while the loop that serves
// clients keeps turning, so a loop that hangs (a deadlock, a handler that
// never returns) stops the pings and systemd restarts the unit. A main thread
// pinging on its own timer would keep a hung server alive.
//
// The serving loop increments a counter every turn (each poll has a bounded
// timeout, so an idle loop turns too); the main thread calls Tick with it
// at least every interval().
//
// Thread safety: one thread calls Tick; the counter may be read from any.
#pragma once

#include <chrono>
#include <cstdint>

namespace gridsync {

class ServiceWatchdog {
 public:
  // From the environment systemd sets (WATCHDOG_USEC, WATCHDOG_PID); disabled
  // outside systemd or without WatchdogSec=.
  static ServiceWatchdog FromEnvironment();

  bool enabled() const { return timeout_.count() > 0; }
  // How often to call Tick: a third of the timeout, so one late ping is not
  // fatal.
  std::chrono::milliseconds interval() const;

  // Sends WATCHDOG=1 when `progress` moved since the previous call (the first
  // call always pings). Returns whether it pinged.
  bool Tick(uint64_t progress);

 private:
  std::chrono::microseconds timeout_{0};
  uint64_t last_progress_ = 0;
  bool first_ = true;
};

// SIGHUP ignored: gridsync's services read their config once, at start, so
// there is nothing to reload, and the default action (terminate) let a
// closed terminal or a log rotator's `kill -HUP` end a shard or worker and
// with it the job. Call first thing in main.
void IgnoreHangup();

// READY=1 (Type=notify): the process serves. A no-op outside systemd.
void NotifyReady(const char* status);
// STOPPING=1, so systemd does not count the shutdown as a hang.
void NotifyStopping();

}  // namespace gridsync
