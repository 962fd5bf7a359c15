// gridsync-bench load (bench_load.cc): the many-workers run against one PS
// shard, split from the command so that each file holds one concern:
// bench_load_run.cc starts the shard and the W worker threads and measures
// them (latency, throughput, memory, CPU, drops); bench_load.cc reads the
// options, sweeps W and reports.
//
// Thread safety: RunWorkers starts and joins its own threads; call it from
// one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/cluster_map.h"
#include "common/sharding.h"
#include "common/status.h"

namespace gridsync::bench {
class CpuGroups;
}

namespace gridsync::bench::load {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMaxGap = 5;  // a batch walks its window in gaps of 1..kMaxGap rows
// Batches made before the run; each iteration of a worker picks one at
// random (row windows spread over the table: with 4096-row batches, 64 of
// them touch most rows of a 2^18-row table).
constexpr uint32_t kBatchPool = 64;
constexpr auto kSamplePeriod = std::chrono::milliseconds(50);
constexpr uint64_t kSlackBytes = uint64_t{8} << 20;  // allocator slack in the memory bound

// Who simulates the workers (bench_load_worker.h).
enum class Driver { kEvents, kClient };

struct LoadArgs {
  std::vector<uint32_t> workers = {8, 32, 128};
  double seconds = 3.0;
  int rounds = 3;  // sweeps of every W; the p99 verdict reads the medians
  uint32_t rows = 4096;
  uint32_t width = 2;
  uint64_t table_rows = uint64_t{1} << 18;
  int warmup = 2;
  int timeout_ms = 10000;
  uint64_t seed = 1;
  // The workers' ZeroMQ I/O threads: > 0, one context with that many shared
  // by every worker; 0, a context (and an I/O thread) per worker.
  int client_io_threads = 1;
  // Emulate the shard's own host: the shard's process and this one (the
  // workers) in CPU groups of equal shares (tools/cpu_groups.h).
  bool shard_host = false;
  Driver driver = Driver::kEvents;
  std::string json_out;
};

struct Latency {
  double p50_us = 0;
  double p99_us = 0;
};

struct WorkerCountResult {
  uint32_t workers = 0;
  int round = 0;                   // which sweep (from 0)
  double seconds = 0;              // timed phase, measured
  uint64_t pushes = 0, pulls = 0;  // timed, completed
  Latency push, pull;
  double ops_per_s = 0, gbps = 0;
  uint64_t rss0 = 0, rss_shard = 0, rss_ready = 0, rss_max = 0, rss_end = 0, hwm = 0, rss_after = 0;
  bool ran = false;  // reached its timed phase
  bool hwm_reset = false;
  // Cores busy over the timed phase: the shard's process, this one (the
  // workers), the rest of the host.
  double shard_cpu = 0, worker_cpu = 0, other_cpu = 0;
  // CPU per operation (us: cores x 1e6 / ops_per_s), 0 when none ran: the
  // shard's and the simulated workers'. Their growth with W says which
  // side a throughput lost at many workers went to.
  double shard_us_per_op() const { return ops_per_s > 0 ? shard_cpu * 1e6 / ops_per_s : 0; }
  double worker_us_per_op() const { return ops_per_s > 0 ? worker_cpu * 1e6 / ops_per_s : 0; }
  uint64_t memory_bound = 0;  // allowed growth over the timed phase
  uint64_t max_waiting_pulls = 0;
  uint64_t shard_pushes = 0, shard_applied = 0, shard_pulls = 0, shard_errors = 0, refusals = 0;
  uint64_t sent_pushes = 0, sent_pulls = 0;
  uint64_t dropped = 0, errors = 0;
  std::string first_error;
  double push_p99_ratio = 0, pull_p99_ratio = 0, worker_ratio = 0;
  double little_ratio = 0;  // the mean latency's ratio Little's law predicts
  bool linear = false;

  // VmHWM only where it was reset at the start of the timed phase.
  int64_t growth() const {
    return static_cast<int64_t>(std::max({rss_max, rss_end, hwm_reset ? hwm : 0})) -
           static_cast<int64_t>(rss_ready);
  }
  bool memory_ok() const { return growth() <= static_cast<int64_t>(memory_bound); }
};

double MiB(double bytes);
// File descriptors for args' largest W (each worker's connection and
// socket, the shard's end of it): the soft limit is raised to the hard
// one where it is short; InvalidArgument, naming both, where the hard one
// is.
Status EnsureFileDescriptors(const LoadArgs& args);
// The initial value of a table cell (known, so pulls can be checked).
float InitialValue(uint64_t row, uint32_t col);
// One shard and n worker threads for args.seconds (after args.warmup
// iterations each): see bench_load.cc's file comment for what is measured.
// With `groups` (args.shard_host), the shard's process joins its "shard".
WorkerCountResult RunWorkers(const LoadArgs& args, const Partition& partition,
                             const std::vector<TableInfo>& tables, uint32_t n,
                             const std::vector<float>& initial, CpuGroups* groups);

}  // namespace gridsync::bench::load
