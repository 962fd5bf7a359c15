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
// WatchdogPinger runs a thread of its own.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace gridsync {

class ServiceWatchdog {
 public:
  // From the environment systemd sets (WATCHDOG_USEC, WATCHDOG_PID); disabled
  // outside systemd or without WatchdogSec=.
  static ServiceWatchdog FromEnvironment();

  bool enabled() const { return timeout_.count() > 0; }
  std::chrono::microseconds timeout() const { return timeout_; }
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

// A liveness ping, for a process whose every wait ends by a timeout of its
// own (a worker: a peer or shard that never answers fails the call, naming
// it), so that a hang ends the process anyway: a thread sends WATCHDOG=1
// every interval while the process runs. What it catches is a process that
// stopped turning altogether (SIGSTOP, a frozen cgroup, a paused machine),
// which its peers only see as a timeout naming it, and which nothing else
// would replace (a hostile probe: a SIGSTOPped worker was never restarted;
// the launcher restarted the other worker, which had only reported it,
// until --max-restarts ran out). A server passes its serving loop's counter
// (`progress`), so that only a loop that turns is pinged for.
class WatchdogPinger {
 public:
  // Starts pinging when `watchdog` is enabled; does nothing otherwise.
  // With `progress`, a ping goes only when its value moved since the last
  // one (the first always goes): a server's serving-loop counter, read
  // from this thread, so that a main thread that waits on something else
  // (a shard's calls to its coordinator, up to timeout_s each) does not
  // starve the watchdog of a loop that turns.
  explicit WatchdogPinger(ServiceWatchdog watchdog, std::function<uint64_t()> progress = {});
  ~WatchdogPinger();  // stops pinging
  WatchdogPinger(const WatchdogPinger&) = delete;
  WatchdogPinger& operator=(const WatchdogPinger&) = delete;

  bool enabled() const { return thread_.joinable(); }
  // Replaces the unit's WatchdogSec= with `timeout` (WATCHDOG_USEC=, sent
  // with a ping; systemd 236 and later) and pings every third of it from
  // now on; does nothing when not enabled. For a timeout the process learns
  // after it started (a worker's, from its config: WorkerWatchdogTimeout).
  void Retune(std::chrono::microseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable_any wake_;
  std::chrono::microseconds timeout_{0};  // guarded by mu_
  bool retuned_ = false;                  // guarded by mu_: a new timeout to announce
  std::jthread thread_;                   // last: starts once the above exist
};

// A worker's watchdog timeout: distributed.timeout_s / 2, at least 3 s. A
// worker pings from a thread of its own while it runs (WatchdogPinger), so
// only a stopped one misses a ping; killed before its peers' waits on it
// time out (timeout_s), it is restarted into the rejoin before they give up
// on it. gridsync launch gives its workers this; under systemd the worker
// retunes the unit's WatchdogSec= to it once it read its config.
std::chrono::microseconds WorkerWatchdogTimeout(double timeout_s);

// SIGHUP ignored: gridsync's services read their config once, at start, so
// there is nothing to reload, and the default action (terminate) let a
// closed terminal or a log rotator's `kill -HUP` end a shard or worker and
// with it the job. Each SIGHUP is logged (a warning) by a thread of its
// own. Call first thing in main, before any thread starts.
void IgnoreHangup();

// How long a server (coordinator, shard) may take from its start to
// READY=1: systemd's default TimeoutStartSec= (90 s), or 3 x
// distributed.timeout_s where that is longer, since a shard's start waits
// up to timeout_s for the coordinator's connection and again for its
// registration. gridsync launch kills a child that neither says READY=1 nor
// pings within it (tools/launch_watchdog.h); under systemd a server asks for
// it at its start (NotifyStartTimeout), since the units cannot know
// timeout_s, and with timeout_s over 45 s the 90 s killed a shard still
// waiting in time.
std::chrono::milliseconds ServerStartTimeout(double timeout_s);
// EXTEND_TIMEOUT_USEC=: the unit's start may take `timeout` from now (a
// no-op outside systemd; the launcher's notify socket ignores it).
void NotifyStartTimeout(std::chrono::milliseconds timeout);

// READY=1 (Type=notify): the process serves. A no-op outside systemd.
void NotifyReady(const char* status);
// STOPPING=1, so systemd does not count the shutdown as a hang.
void NotifyStopping();

}  // namespace gridsync
