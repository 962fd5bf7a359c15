#include "ops/service_watchdog.h"

#include <pthread.h>
#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <string>
#include <thread>

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

WatchdogPinger::WatchdogPinger(ServiceWatchdog watchdog, std::function<uint64_t()> progress) {
  if (!watchdog.enabled()) return;
  timeout_ = watchdog.timeout();
  thread_ =
      std::jthread([this, watchdog, progress = std::move(progress)](std::stop_token stop) mutable {
        std::unique_lock<std::mutex> lock(mu_);
        while (!stop.stop_requested()) {
          if (retuned_) {
            sd_notifyf(0, "WATCHDOG=1\nWATCHDOG_USEC=%llu",
                       static_cast<unsigned long long>(timeout_.count()));
            retuned_ = false;
          } else if (progress) {
            watchdog.Tick(progress());  // only when it moved: a loop's rule
          } else {
            sd_notify(0, "WATCHDOG=1");
          }
          const auto third = std::max(timeout_ / 3, std::chrono::microseconds(1000));
          wake_.wait_for(lock, stop, third, [this] { return retuned_; });
        }
      });
}

void WatchdogPinger::Retune(std::chrono::microseconds timeout) {
  if (!enabled() || timeout.count() <= 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    timeout_ = timeout;
    retuned_ = true;
  }
  wake_.notify_all();
}

WatchdogPinger::~WatchdogPinger() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
}

std::chrono::microseconds WorkerWatchdogTimeout(double timeout_s) {
  const auto half = std::chrono::microseconds(static_cast<int64_t>(timeout_s * 5e5));
  return std::max(half, std::chrono::microseconds(3'000'000));
}

std::chrono::milliseconds ServerStartTimeout(double timeout_s) {
  const auto three = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 3000.0));
  return std::max(three, std::chrono::milliseconds(90'000));
}

void NotifyStartTimeout(std::chrono::milliseconds timeout) {
  sd_notifyf(0, "EXTEND_TIMEOUT_USEC=%llu",
             static_cast<unsigned long long>(timeout.count()) * 1000ull);
}

void NotifyReady(const char* status) { sd_notifyf(0, "READY=1\nSTATUS=%s", status); }

void NotifyStopping() { sd_notify(0, "STOPPING=1"); }

void IgnoreHangup() {
  // Blocked, not SIG_IGN, so that a thread of its own can take it with
  // sigwait and say so: an operator's `kill -HUP` (expecting a reload) or a
  // closed terminal left no trace. Blocked signals interrupt no system call
  // (a handler would, and ZeroMQ's polls then fail with EINTR). The mask is
  // inherited by every thread started later, hence "first thing in main".
  sigset_t hangup;
  sigemptyset(&hangup);
  sigaddset(&hangup, SIGHUP);
  if (pthread_sigmask(SIG_BLOCK, &hangup, nullptr) != 0) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGHUP, &ignore, nullptr);
    return;
  }
  std::thread([hangup] {
    for (;;) {
      int signal = 0;
      if (sigwait(&hangup, &signal) != 0) continue;
      spdlog::warn(
          "received SIGHUP; ignored: the config is read once, at start (restart the process to "
          "apply a changed config)");
    }
  }).detach();
}

}  // namespace gridsync
