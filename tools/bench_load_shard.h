// The load bench's PS shard in a process of its own (bench_load.h): forked
// before the bench starts any thread, serving on loopback, and driven over
// two pipes. Its own process, so the shard's memory and CPU are read apart
// from the W simulated workers' (their threads, contexts and buffers), as
// they would be on a host of its own.
//
// The protocol, one line each way: the child first writes "ready
// <endpoint> <reading>" (or "error <message>" and exits 1); then for each
// command the parent writes ("read", "trim": malloc_trim first, "peak":
// reset VmHWM) it answers "ok <reading>"; "stop" (or the parent's end of
// the pipe closing) stops the shard, and the child exits 0. A reading is
// the shard's counters, VmRSS and VmHWM and the CPU seconds the child used.
//
// Thread safety: one thread drives a ShardProcess.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/sharding.h"
#include "common/status.h"

namespace gridsync::bench::load {

struct ShardReading {
  uint64_t pushes = 0, applied_steps = 0, pulls = 0, errors = 0;  // the shard's stats()
  uint64_t refusals = 0, waiting_pulls = 0;                       // ... and serving_stats()
  uint64_t rss = 0, hwm = 0;  // bytes, /proc/self/status of the child
  bool hwm_reset = false;     // the last "peak" was taken by the kernel
  double cpu_seconds = 0;     // user + system, the child's threads
};

class ShardProcess {
 public:
  // Forks the child, which starts an async PsShard over `partition` for
  // `workers` workers on tcp://127.0.0.1 (every wait `timeout`); returns
  // once it reported its endpoint. Refused while this process runs more
  // than one thread (a fork would copy locks other threads hold).
  static Result<std::unique_ptr<ShardProcess>> Fork(const Partition& partition, uint32_t workers,
                                                    std::chrono::milliseconds timeout);
  // Kills (SIGKILL) and reaps a child still running.
  ~ShardProcess();
  ShardProcess(const ShardProcess&) = delete;
  ShardProcess& operator=(const ShardProcess&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  pid_t pid() const { return pid_; }
  // The reading the child took before it started the shard.
  const ShardReading& at_start() const { return at_start_; }

  Result<ShardReading> Read() { return Command("read"); }
  Result<ShardReading> TrimAndRead() { return Command("trim"); }
  Result<ShardReading> ResetPeak() { return Command("peak"); }
  // Stops the shard and checks that the child exited cleanly.
  Status Stop();

 private:
  ShardProcess(pid_t pid, int control_fd, int report_fd, std::chrono::milliseconds timeout)
      : pid_(pid), control_fd_(control_fd), report_fd_(report_fd), timeout_(timeout) {}
  Result<ShardReading> Command(const char* command);
  // The next line from the child within the timeout; its exit when it left.
  Result<std::string> ReadLine(const char* awaiting);
  std::string Describe() const;

  pid_t pid_;
  int control_fd_;
  int report_fd_;
  std::chrono::milliseconds timeout_;
  bool reaped_ = false;
  std::string pending_;  // read past the last line
  std::string endpoint_;
  ShardReading at_start_;
};

}  // namespace gridsync::bench::load
