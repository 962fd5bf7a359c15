#include "ops/service_watchdog.h"

#include <systemd/sd-daemon.h>

#include <condition_variable>
#include <csignal>
#include <mutex>
#include <string>

namespace gridsync {

ServiceWatchdog ServiceWatchdog::FromEnvironment() {
  ServiceWatchdog watchdog;
  uint64_t usec = 0;
  // > 0 only when WATCHDOG_USEC is set and WATCHDOG_PID (if set) is us.
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) > 0 && usec > 0) {
    watchdog.timeout_ = std::chrono::microseconds(usec);
  }
  return watchdog;
}

std::chrono::milliseconds ServiceWatchdog::interval() const {
  if (!enabled()) return std::chrono::milliseconds(1000);
  const auto third = std::chrono::duration_cast<std::chrono::milliseconds>(timeout_ / 3);
  return third.count() > 0 ? third : std::chrono::milliseconds(1);
}

bool ServiceWatchdog::Tick(uint64_t progress) {
  if (!enabled()) return false;
  if (!first_ && progress == last_progress_) return false;
  first_ = false;
  last_progress_ = progress;
  sd_notify(0, "WATCHDOG=1");
  return true;
}

WatchdogPinger::WatchdogPinger(ServiceWatchdog watchdog) {
  if (!watchdog.enabled()) return;
  thread_ = std::jthread([watchdog](std::stop_token stop) mutable {
    std::mutex mu;
    std::condition_variable_any wake;
    uint64_t beat = 0;
    std::unique_lock<std::mutex> lock(mu);
    while (!stop.stop_requested()) {
      watchdog.Tick(++beat);
      wake.wait_for(lock, stop, watchdog.interval(), [] { return false; });
    }
  });
}

WatchdogPinger::~WatchdogPinger() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
}

void NotifyReady(const char* status) { sd_notifyf(0, "READY=1\nSTATUS=%s", status); }

void NotifyStopping() { sd_notify(0, "STOPPING=1"); }

void IgnoreHangup() {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGHUP, &ignore, nullptr);
}

}  // namespace gridsync
