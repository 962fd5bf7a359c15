// gridsync-bench load: many workers against ONE PS shard (issue 14, item 2).
// For each --workers count W (and each of --rounds sweeps): a fresh real
// PsShard in a process of its own and W simulated workers in this one,
// pushing and pulling sparse rows as fast as their acks and replies come
// back, for --seconds. --driver picks who simulates them
// (bench_load_worker.h): events (the default), W connections driven from
// one thread, so that the cores of this host go to the shard as they would
// with each worker on a host of its own; or client, W real PsClients on W
// threads (W threads, their handshake watches and W whole tables: on 2
// cores they took 17-20% more CPU per operation at W=128 than at W=8, and
// that, not the shard, was W=128's lost throughput). Reported per W: throughput, p50/p99
// latency of a push and of a pull, the shard's memory while it serves W
// workers, and whether anything was dropped.
//
// Consistency: async, as pushpull runs it. Every push is one Adam step
// applied on arrival and pulls never wait, so what is measured is the
// shard's cost of serving W independent clients. bsp would hold each step
// until all W workers pushed it: the workers would run in lock step and the
// latency would be that of the slowest of W threads on the host's cores
// (a barrier's, not the shard's); ssp would add the same coupling at the
// staleness bound.
//
// One table of --table-rows rows x --width floats (a hash-grid level). A
// worker's iteration k: Push(step k, the rows of batch k) and wait for the
// ack, then SendPull + ReceivePull of batch k + 1's rows (min_version 0,
// for_step k + 1, as ps_sync pulls the next step's rows under async), which
// are the rows it pushes next. A batch is --rows sorted, distinct row ids:
// a random window of the table walked with random gaps of 1..5 rows (mean 3,
// like pushpull's every 3rd row), the window and the gaps drawn from a
// counter-based RNG. 64 such batches are made before the run (making them
// in the loop cost the host as much CPU as the shard's Adam, which a worker
// on its own host would not take from the shard) and every iteration of
// every worker picks one at random, so workers' batches overlap at random,
// as a hash grid's batches do. Gradients are small, nonzero and drawn the
// same way. The workers share one ZeroMQ context with one I/O thread
// (--client-io-threads; 0 gives each client its own, as separate processes
// have: W contexts would put W more threads on the host's cores).
// --warmup untimed iterations per worker come first (connections made,
// buffers grown); then all W start together.
//
// Latency: each push (send until its ack is read) and each pull (send until
// its reply's last part is read and checked; with --driver client the Push
// call and the SendPull + ReceivePull pair), on every worker, merged over
// workers; p50/p99 by nearest rank. Throughput:
// timed pushes + pulls per second of the timed phase (from the start signal
// until the last worker finished its last operation), and GB/s of payload:
// per row a push carries a 4 B id + 4 x width B of values, and a pull asks
// for a 4 B id and gets 4 x width B back (headers not counted; 24 B per row
// at width 2, as pushpull counts).
//
// Memory: the shard runs in a process of its own (bench_load_shard.h),
// forked for each W before this process starts a thread or allocates the
// workers' buffers, so its VmRSS and VmHWM (read by the child from
// /proc/self/status, asked over a pipe) are the shard's alone, as on a host
// of its own: the workers' threads, their ZeroMQ context and, with
// --driver client, their copies of the table (each holds a whole one, as a
// training worker's model does: PsClient's pulls write into the whole
// table) are this process's.
// Readings per W (the ones between phases after malloc_trim, so a phase's
// freed transients are not the next one's):
//   - rss0: the child before the shard starts;
//   - shard = after it started and took the initial values - rss0: its
//     state (parameters, gradient buffer and Adam's state, some 4-5 x the
//     table's bytes), its threads and ZeroMQ context;
//   - perW = (ready - rss0 - shard) / W, ready = all W clients connected and
//     warmed up: per worker the shard's end of one TCP connection (ZeroMQ's
//     pipe and buffers) and the malloc arenas of the messages;
//   - grow = the most of VmRSS sampled every 50 ms and VmHWM (reset through
//     /proc/self/clear_refs when the timed phase starts; left out where the
//     kernel refuses) over the timed phase, minus ready: what "bounded" is
//     about, since a queue or a leak grows with the operations served;
//   - after: once the W clients closed their connections.
// Besides memory the shard's serving_stats() are sampled: pulls held
// waiting (none under async; "wait") and refusals. The shard keeps no queue
// of its own under async: a push is applied and acked in the I/O thread's
// turn; what waits is in ZeroMQ's pipes, and since every worker waits for
// its reply before sending again at most W requests are in flight.
// The CPU the timed phase had is printed too: cores busy in the shard's
// process and in this one (getrusage) and in the rest of the host
// (/proc/stat), since a build sharing the cores moves the latencies as
// much as W does.
//
// Targets, evaluated on every run:
//   - nothing dropped: #drop = |pushes the workers sent - the shard's
//     stats().pushes| + |the same - stats().applied_steps (one per push
//     under async)| + |pulls sent - stats().pulls|, read after every worker
//     finished; #err = pushes or pulls that failed or timed out on the
//     worker (every wait has --timeout-ms), pulls that left a pulled value
//     unwritten (the rows are set to NaN before each pull), shard errors and
//     refusals; both must be 0;
//   - memory bounded: grow <= W x (a push + a pull request + its reply), all
//     of every worker's traffic in flight at once, + 8 MiB (allocator
//     slack); perW is printed, with what it holds;
//   - p99 no faster than linear: p99(W) / p99(W_min) <= W / W_min for the
//     push and the pull latency, per W. Printed beside it, for reading a
//     FAIL: Lx = (W / W_min) x throughput(W_min) / throughput(W), the ratio
//     of mean latencies a closed loop's queueing gives (Little's law). Once
//     W_min workers saturate the cores, latency grows as Lx: p99x stays
//     near Wx while the throughput holds and exceeds it when W gets less
//     throughput (cores taken by another process show in "other").
// Output: '#' lines are comments (settings, the header row, details,
// verdicts); every other line is one row per W, printed once every W ran
// (the ratios need W_min's row; progress goes to stderr). --json writes the
// same. Exit code: 0 when everything ran and nothing was dropped or failed
// (the memory and p99 targets are reported, not required), 1 otherwise, 2
// on bad arguments.
//
// Caveat for small hosts: W worker threads, their ZeroMQ I/O thread and the
// shard's process share the host's cores; with many more threads than cores
// the latency is mostly queueing (a closed loop: latency ~ W x the time
// the shard and the clients spend per operation, Little's law), so p99 is
// compared with linear growth, and the scheduler's time slices add to p99.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "common/cli_parse.h"
#include "common/cluster_map.h"
#include "common/config.h"
#include "common/host_memory.h"
#include "common/sharding.h"
#include "common/status.h"
#include "common/wire/message.h"
#include "server/ps_shard.h"
#include "tools/bench.h"
#include "tools/bench_load.h"
#include "tools/bench_shard_map.h"
#include "tools/bench_stats.h"
#include "tools/cpu_groups.h"
#include "worker/ps_client.h"

namespace gridsync::bench {
namespace {

using load::InitialValue;
using load::kMaxGap;
using load::kSlackBytes;
using load::LoadArgs;
using load::MiB;
using load::RunWorkers;
using load::WorkerCountResult;

// The ratios of row r against `base` (W_min's; its ops_per_s 0 when it did
// not run: the ratios are then NaN and the verdict FAIL).
void Ratios(const WorkerCountResult& base, uint32_t w_min, WorkerCountResult* r) {
  r->worker_ratio = static_cast<double>(r->workers) / w_min;
  const double nan = std::nan("");
  r->little_ratio = base.ops_per_s > 0 ? r->worker_ratio * base.ops_per_s / r->ops_per_s : nan;
  r->push_p99_ratio = base.ops_per_s > 0 ? r->push.p99_us / base.push.p99_us : nan;
  r->pull_p99_ratio = base.ops_per_s > 0 ? r->pull.p99_us / base.pull.p99_us : nan;
  // A tiny tolerance: the base row's own ratios are exactly 1.
  r->linear = r->push_p99_ratio <= r->worker_ratio * (1 + 1e-9) &&
              r->pull_p99_ratio <= r->worker_ratio * (1 + 1e-9);
}

// Per W (in `workers`' order): the median over the rounds that ran of the
// latencies and the throughput, and how many rounds ran (0: none,
// and the rest is zeros).
struct MedianRow {
  WorkerCountResult row;  // the medians, and the ratios computed from them
  int runs = 0;           // rounds of this W with figures
};

std::vector<MedianRow> MediansByWorkers(const std::vector<WorkerCountResult>& results,
                                        const std::vector<uint32_t>& workers) {
  std::vector<MedianRow> medians;
  for (uint32_t n : workers) {
    std::vector<double> push50, push99, pull50, pull99, ops;
    for (const auto& r : results) {
      // Rows without figures: no timed operation succeeded (NaN
      // percentiles, which would also break the sort).
      if (r.workers != n || !r.ran || !(r.ops_per_s > 0) || !std::isfinite(r.push.p99_us) ||
          !std::isfinite(r.pull.p99_us)) {
        continue;
      }
      push50.push_back(r.push.p50_us);
      push99.push_back(r.push.p99_us);
      pull50.push_back(r.pull.p50_us);
      pull99.push_back(r.pull.p99_us);
      ops.push_back(r.ops_per_s);
    }
    MedianRow m;
    m.row.workers = n;
    m.runs = static_cast<int>(ops.size());
    if (!ops.empty()) {
      m.row.push = {Median(push50), Median(push99)};
      m.row.pull = {Median(pull50), Median(pull99)};
      m.row.ops_per_s = Median(ops);
    }
    medians.push_back(m);
  }
  return medians;
}

int BadArgs(const std::string& why) {
  std::fprintf(stderr, "gridsync-bench load: %s\n", why.c_str());
  return 2;
}

int RunLoad(const LoadArgs& args) {
  if (args.workers.empty()) return BadArgs("--workers is empty; allowed: a list such as 8,32,128");
  for (uint32_t w : args.workers) {
    if (w == 0 || w > 1024) {
      return BadArgs("--workers " + std::to_string(w) + "; allowed: 1..1024 each");
    }
    if (std::count(args.workers.begin(), args.workers.end(), w) > 1) {
      return BadArgs("--workers lists " + std::to_string(w) + " twice; allowed: distinct counts");
    }
  }
  if (args.rows == 0 || args.width == 0) return BadArgs("--rows and --width must be >= 1");
  if (args.table_rows > std::numeric_limits<uint32_t>::max() ||
      args.table_rows <= uint64_t{args.rows} * kMaxGap) {
    return BadArgs("--table-rows " + std::to_string(args.table_rows) + "; allowed: more than " +
                   std::to_string(kMaxGap) + " x --rows (" +
                   std::to_string(uint64_t{args.rows} * kMaxGap) + ") and below 2^32");
  }
  if (!(args.seconds > 0 && args.seconds <= 600)) return BadArgs("--seconds: allowed (0, 600]");
  if (args.timeout_ms <= 0 || args.timeout_ms > 3'600'000) {
    return BadArgs("--timeout-ms " + std::to_string(args.timeout_ms) + "; allowed: 1..3600000");
  }

  const std::vector<TableInfo> tables = {{"level", args.table_rows, args.width}};
  auto made = Partition::Make(tables, 1, ModelParallelDim::kRow);
  if (!made.ok()) {
    std::fprintf(stderr, "gridsync-bench load: %s\n", made.status().ToString().c_str());
    return 1;
  }
  // The shards and clients keep references to it: it stays put from here.
  const Partition partition = std::move(made).value();
  const uint32_t w_min = *std::min_element(args.workers.begin(), args.workers.end());
  if (Status fds = load::EnsureFileDescriptors(args); !fds.ok()) return BadArgs(fds.message());
  {
    // Refused by name before anything is allocated, as gridsync-ps and the
    // worker refuse a partition past the machine's memory: the shard's
    // state, and a copy of the table for each worker (and the initial one).
    const uint32_t w_top = *std::max_element(args.workers.begin(), args.workers.end());
    ShardOptions shard_options;
    shard_options.workers = w_top;
    const double table_bytes = static_cast<double>(args.table_rows) * args.width * sizeof(float);
    const double need = static_cast<double>(ShardStoreBytes(partition, shard_options)) +
                        (w_top + 2.0) * table_bytes;
    if (const uint64_t available = AvailableToThisProcessBytes();
        available > 0 && need > static_cast<double>(available)) {
      char why[512];
      std::snprintf(why, sizeof(why),
                    "--table-rows %llu x --width %u with %u workers needs about %.1f GiB (the "
                    "shard's parameters, gradients and Adam state, and a copy of the table for "
                    "each worker) but %.1f GiB are available; allowed: a smaller table or fewer "
                    "workers",
                    static_cast<unsigned long long>(args.table_rows), args.width, w_top,
                    need / 1073741824.0, static_cast<double>(available) / 1073741824.0);
      return BadArgs(why);
    }
  }
  std::vector<float> initial(args.table_rows * args.width);
  for (uint64_t row = 0; row < args.table_rows; ++row) {
    for (uint32_t c = 0; c < args.width; ++c) initial[row * args.width + c] = InitialValue(row, c);
  }
  const double push_bytes = args.rows * (sizeof(uint32_t) + args.width * 4.0);
  std::unique_ptr<CpuGroups> groups;
  if (args.shard_host) {
    auto cpu_groups = CpuGroups::Make({"shard", "workers"});
    if (!cpu_groups.ok()) return BadArgs("--shard-host: " + cpu_groups.status().message());
    groups = std::move(cpu_groups).value();
    if (Status joined = groups->Join("workers", ::getpid()); !joined.ok())
      return BadArgs("--shard-host: " + joined.message());
  }
  const bool events = args.driver == load::Driver::kEvents;
  const std::string io = args.client_io_threads > 0 || events
                             ? "one context for all workers, " +
                                   std::to_string(std::max(args.client_io_threads, 1)) +
                                   " I/O thread(s)"
                             : "a context and an I/O thread per worker";
  const std::string driver =
      events ? "W workers as W DEALER connections driven from one thread (--driver events: "
               "messages written and read by PsClient's wire layer, without its per-worker "
               "thread and table; ZeroMQ I/O: " +
                   io + ")"
             : "W PsClient workers on W threads (--driver client; ZeroMQ I/O: " + io + ")";

  std::printf(
      "# gridsync-bench load: 1 PS shard (async: each push one Adam step on arrival, pulls never "
      "wait; %d shard threads) in a process of its own on tcp://127.0.0.1, %s; table %llu rows "
      "x %u floats; %u rows per push and per pull (sorted distinct ids, a random window walked in "
      "gaps of 1..%u; %u such batches made "
      "before the run, each iteration picking one at random); %.1f s per W after %d warmup "
      "iterations per worker; timeout %d ms; %u cores; %s\n",
      ShardOptions{}.threads, driver.c_str(), static_cast<unsigned long long>(args.table_rows),
      args.width, args.rows, kMaxGap, load::kBatchPool, args.seconds, args.warmup, args.timeout_ms,
      std::thread::hardware_concurrency(),
      groups ? ("--shard-host: the shard's process and the workers' in CPU groups of equal "
                "shares under " +
                groups->path() + " (under contention each has half the cores)")
                   .c_str()
             : "the shard and the workers share the cores");
  std::printf(
      "# per iteration: Push (send + ack; push_*) then SendPull + ReceivePull of the next batch "
      "(pull_*); p50/p99 by nearest rank over all workers; kops/s = (pushes + pulls) / s; GB/s = "
      "payload (%.0f B push + %.0f B pull per iteration; headers not counted) / s\n",
      push_bytes, push_bytes);
  std::printf(
      "# memory (MiB, of the shard's process: forked before the workers' buffers and threads): "
      "rss0 before the shard started; shard = after its start and the init push - rss0; "
      "perW_KiB = (ready - rss0 - shard) / W, ready = all W clients connected and warmed up; "
      "grow = max(VmRSS sampled every 50 ms, VmHWM) over the timed phase - ready; bound = W x "
      "(push + pull request + pull reply) + %.0f; after = VmRSS once the W clients closed "
      "(malloc_trim)\n",
      MiB(kSlackBytes));
  std::printf(
      "# #drop = |pushes sent - shard's pushes| + |pushes sent - shard's applied steps| + |pulls "
      "sent - shard's pulls|; #err = failed or timed-out pushes and pulls + pulls leaving a row "
      "unwritten + shard errors and refusals; wait = most pulls the shard held; cpu = cores busy "
      "in the shard's process, wcpu = in the workers' (this one), other = in the rest of the "
      "host, over the timed phase; p99x = p99(W) / "
      "p99(W=%u), push and pull; Wx = W / %u; linear = both p99x <= Wx; Lx = Wx x kops/s(W=%u) / "
      "kops/s(W), the latency ratio a closed loop's queueing gives (Little's law; information: "
      "above Wx when W gets less throughput, e.g. cores taken by other processes); sh_us, wk_us = "
      "CPU per operation (us) of the shard's process and of the workers' (cpu or wcpu x 1e6 / "
      "ops/s): where a throughput lost at many workers went, the shard's cost per operation or "
      "that of W simulated workers sharing this host\n",
      w_min, w_min, w_min);
  std::printf(
      "#%4s %6s %5s %7s %9s %9s %9s %9s %7s %6s %6s %6s %8s %8s %6s %6s %6s %4s %5s %5s %5s "
      "%5s %5s %9s %9s %6s %6s %6s %6s %6s\n",
      "round", "W", "secs", "iters", "push_p50", "push_p99", "pull_p50", "pull_p99", "kops/s",
      "GB/s", "rss0", "shard", "perW_KiB", "grow", "bound", "hwm", "after", "wait", "#drop", "#err",
      "cpu", "wcpu", "other", "p99x_push", "p99x_pull", "Wx", "linear", "Lx", "sh_us", "wk_us");
  std::fflush(stdout);

  // The rows are printed once all ran: the ratios need W_min's row. Each
  // round runs every W, starting one W later than the round before, so no
  // W always runs first (on a host whose neighbours come and go).
  std::vector<WorkerCountResult> results;
  for (int round = 0; round < args.rounds; ++round) {
    for (size_t i = 0; i < args.workers.size(); ++i) {
      const uint32_t n = args.workers[(i + static_cast<size_t>(round)) % args.workers.size()];
      std::fprintf(stderr, "gridsync-bench load: round %d, %u workers...\n", round + 1, n);
      results.push_back(RunWorkers(args, partition, tables, n, initial, groups.get()));
      results.back().round = round;
    }
  }
  std::stable_sort(results.begin(), results.end(),
                   [](const WorkerCountResult& a, const WorkerCountResult& b) {
                     return a.round != b.round ? a.round < b.round : a.workers < b.workers;
                   });
  bool all_memory = true;
  uint64_t dropped = 0, errors = 0;
  for (auto& r : results) {
    if (!r.ran) {  // failed before its timed phase: the details line says why
      std::printf("%5d %6u did not run\n", r.round + 1, r.workers);
      all_memory = false;
      errors += r.errors;
      continue;
    }
    // Against W_min's row of the same round: side by side.
    const auto base = std::find_if(results.begin(), results.end(), [&](const auto& b) {
      return b.round == r.round && b.workers == w_min;
    });
    Ratios(base->ran ? *base : WorkerCountResult{}, w_min, &r);
    all_memory = all_memory && r.memory_ok();
    dropped += r.dropped;
    errors += r.errors;
    const double shard_mib = MiB(static_cast<double>(r.rss_shard) - static_cast<double>(r.rss0));
    const double per_worker_kib =
        (static_cast<double>(r.rss_ready) - static_cast<double>(r.rss_shard)) / 1024.0 / r.workers;
    std::printf(
        "%5d %6u %5.2f %7llu %9.0f %9.0f %9.0f %9.0f %7.2f %6.3f %6.1f %6.1f %8.0f %8.2f %6.1f "
        "%6.1f %6.1f %4llu %5llu %5llu %5.2f %5.2f %5.2f %9.2f %9.2f %6.1f %6s %6.1f %6.1f "
        "%6.1f\n",
        r.round + 1, r.workers, r.seconds, static_cast<unsigned long long>(r.pushes), r.push.p50_us,
        r.push.p99_us, r.pull.p50_us, r.pull.p99_us, r.ops_per_s / 1e3, r.gbps,
        MiB(static_cast<double>(r.rss0)), shard_mib, per_worker_kib,
        MiB(static_cast<double>(r.growth())), MiB(static_cast<double>(r.memory_bound)),
        MiB(static_cast<double>(r.hwm)), MiB(static_cast<double>(r.rss_after)),
        static_cast<unsigned long long>(r.max_waiting_pulls),
        static_cast<unsigned long long>(r.dropped), static_cast<unsigned long long>(r.errors),
        r.shard_cpu, r.worker_cpu, r.other_cpu, r.push_p99_ratio, r.pull_p99_ratio, r.worker_ratio,
        r.linear ? "PASS" : "FAIL", r.little_ratio, r.shard_us_per_op(), r.worker_us_per_op());
  }
  // The medians over the rounds, per W: what the p99 verdict reads.
  std::vector<MedianRow> medians = MediansByWorkers(results, args.workers);
  bool all_linear = true;
  std::printf(
      "# medians over %d round(s), per W (p50, p99 and kops/s each the median of its "
      "rounds; ratios from these medians):\n",
      args.rounds);
  std::printf("#%5s %4s %9s %9s %9s %9s %7s %9s %9s %6s %6s %6s\n", "W", "runs", "push_p50",
              "push_p99", "pull_p50", "pull_p99", "kops/s", "p99x_push", "p99x_pull", "Wx",
              "linear", "Lx");
  const MedianRow& median_base = *std::find_if(
      medians.begin(), medians.end(), [&](const auto& m) { return m.row.workers == w_min; });
  for (auto& [m, runs] : medians) {
    if (runs == 0) {
      std::printf("%6u %4d did not run\n", m.workers, 0);
      all_linear = false;
      continue;
    }
    Ratios(median_base.runs > 0 ? median_base.row : WorkerCountResult{}, w_min, &m);
    all_linear = all_linear && m.linear;
    std::printf("%6u %4d %9.0f %9.0f %9.0f %9.0f %7.2f %9.2f %9.2f %6.1f %6s %6.1f\n", m.workers,
                runs, m.push.p50_us, m.push.p99_us, m.pull.p50_us, m.pull.p99_us, m.ops_per_s / 1e3,
                m.push_p99_ratio, m.pull_p99_ratio, m.worker_ratio, m.linear ? "PASS" : "FAIL",
                m.little_ratio);
  }
  // Details after the tables, so the rows stay one block.
  for (const auto& r : results) {
    std::printf(
        "# round %d, W=%u: shard counted pushes %llu, applied steps %llu, pulls %llu, errors %llu, "
        "refusals "
        "%llu; workers sent pushes %llu, pulls %llu (warmup included; timed: %llu each); VmHWM "
        "%s%s%s\n",
        r.round + 1, r.workers, static_cast<unsigned long long>(r.shard_pushes),
        static_cast<unsigned long long>(r.shard_applied),
        static_cast<unsigned long long>(r.shard_pulls),
        static_cast<unsigned long long>(r.shard_errors),
        static_cast<unsigned long long>(r.refusals), static_cast<unsigned long long>(r.sent_pushes),
        static_cast<unsigned long long>(r.sent_pulls), static_cast<unsigned long long>(r.pushes),
        !r.ran        ? "not read (no timed phase)"
        : r.hwm_reset ? "reset at the start of the timed phase"
                      : "not resettable here (clear_refs refused): left out of grow",
        r.first_error.empty() ? "" : "; first error: ", r.first_error.c_str());
  }
  const uint32_t w_max = *std::max_element(args.workers.begin(), args.workers.end());
  // The first round of W_max that ran (none: the figure reads 0).
  const auto top_at = std::find_if(results.begin(), results.end(), [&](const WorkerCountResult& r) {
    return r.workers == w_max && r.ran;
  });
  WorkerCountResult top;
  if (top_at != results.end()) top = *top_at;
  top.workers = w_max;
  std::printf(
      "# targets: nothing dropped: %s (#drop %llu, #err %llu over all W); memory bounded: %s "
      "(grow within bound for every W; per added worker %.0f KiB of the shard's at W=%u: its "
      "connection's ZeroMQ pipe and buffers, malloc arenas of its messages; not growing with "
      "the operations); p99 no faster than linear in W: %s\n",
      dropped == 0 && errors == 0 ? "PASS" : "FAIL", static_cast<unsigned long long>(dropped),
      static_cast<unsigned long long>(errors), all_memory ? "PASS" : "FAIL",
      (static_cast<double>(top.rss_ready) - static_cast<double>(top.rss_shard)) / 1024.0 /
          top.workers,
      top.workers, all_linear ? "PASS" : "FAIL");
  std::fflush(stdout);

  if (!args.json_out.empty()) {
    nlohmann::json out;
    out["settings"] = {{"shards", 1},
                       {"consistency", "async"},
                       {"shard_threads", ShardOptions{}.threads},
                       {"table_rows", args.table_rows},
                       {"width", args.width},
                       {"rows_per_message", args.rows},
                       {"max_gap", kMaxGap},
                       {"seconds", args.seconds},
                       {"warmup", args.warmup},
                       {"timeout_ms", args.timeout_ms},
                       {"seed", args.seed},
                       {"client_io_threads", args.client_io_threads},
                       {"driver", events ? "events" : "client"},
                       {"shard_host", args.shard_host},
                       {"cores", std::thread::hardware_concurrency()},
                       {"payload_bytes_per_iteration", 2 * push_bytes}};
    out["rows"] = nlohmann::json::array();
    for (const auto& r : results) {
      out["rows"].push_back({{"round", r.round + 1},
                             {"workers", r.workers},
                             {"ran", r.ran},
                             {"seconds", r.seconds},
                             {"pushes", r.pushes},
                             {"pulls", r.pulls},
                             {"push_p50_us", r.push.p50_us},
                             {"push_p99_us", r.push.p99_us},
                             {"pull_p50_us", r.pull.p50_us},
                             {"pull_p99_us", r.pull.p99_us},
                             {"ops_per_s", r.ops_per_s},
                             {"gbps", r.gbps},
                             {"rss0_bytes", r.rss0},
                             {"rss_shard_bytes", r.rss_shard},
                             {"rss_ready_bytes", r.rss_ready},
                             {"rss_max_bytes", r.rss_max},
                             {"rss_end_bytes", r.rss_end},
                             {"hwm_bytes", r.hwm},
                             {"hwm_reset", r.hwm_reset},
                             {"cpu_shard_cores", r.shard_cpu},
                             {"cpu_workers_cores", r.worker_cpu},
                             {"cpu_other_cores", r.other_cpu},
                             {"shard_cpu_us_per_op", r.shard_us_per_op()},
                             {"workers_cpu_us_per_op", r.worker_us_per_op()},
                             {"rss_after_bytes", r.rss_after},
                             {"growth_bytes", r.growth()},
                             {"memory_bound_bytes", r.memory_bound},
                             {"memory_ok", r.memory_ok()},
                             {"max_waiting_pulls", r.max_waiting_pulls},
                             {"shard_pushes", r.shard_pushes},
                             {"shard_applied_steps", r.shard_applied},
                             {"shard_pulls", r.shard_pulls},
                             {"shard_errors", r.shard_errors},
                             {"shard_refusals", r.refusals},
                             {"sent_pushes", r.sent_pushes},
                             {"sent_pulls", r.sent_pulls},
                             {"dropped", r.dropped},
                             {"errors", r.errors},
                             {"first_error", r.first_error},
                             {"push_p99_ratio", r.push_p99_ratio},
                             {"pull_p99_ratio", r.pull_p99_ratio},
                             {"worker_ratio", r.worker_ratio},
                             {"little_ratio", r.little_ratio},
                             {"p99_linear", r.linear}});
    }
    out["medians"] = nlohmann::json::array();
    for (const auto& [m, runs] : medians) {
      out["medians"].push_back({{"workers", m.workers},
                                {"rounds", runs},
                                {"push_p50_us", m.push.p50_us},
                                {"push_p99_us", m.push.p99_us},
                                {"pull_p50_us", m.pull.p50_us},
                                {"pull_p99_us", m.pull.p99_us},
                                {"ops_per_s", m.ops_per_s}});
    }
    out["targets"] = {{"nothing_dropped", dropped == 0 && errors == 0},
                      {"memory_bounded", all_memory},
                      {"p99_linear", all_linear}};
    std::ofstream file(args.json_out);
    file << out.dump(2) << "\n";
    if (!file) {
      std::fprintf(stderr, "gridsync-bench load: cannot write %s\n", args.json_out.c_str());
      return 1;
    }
  }
  return dropped == 0 && errors == 0 ? 0 : 1;
}

}  // namespace

Runner AddLoadCommand(CLI::App* app) {
  auto args = std::make_shared<LoadArgs>();
  auto* cmd = app->add_subcommand(
      "load", "Many workers (threads) pushing and pulling sparse rows against one PS shard");
  cmd->add_option("--workers", args->workers,
                  "Worker counts to run, one shard each (e.g. 8,32,128)")
      ->delimiter(',');
  cmd->add_option("--seconds", args->seconds, "Timed seconds per worker count and round");
  cmd->add_option("--rounds", args->rounds,
                  "Rounds of the whole sweep; the p99 verdict reads each W's median over them")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--rows", args->rows, "Rows per push and per pull");
  cmd->add_option("--width", args->width, "Floats per row (a hash-grid level: 2)");
  cmd->add_option("--table-rows", args->table_rows, "Rows of the table");
  cmd->add_option("--warmup", args->warmup, "Untimed iterations per worker")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--timeout-ms", args->timeout_ms, "Timeout of every push and pull wait");
  // Non-negative: -1 wrapped to 2^64 - 1 silently (a probe).
  cmd->add_option("--seed", args->seed, "Seed of the batches' row ids and gradients")
      ->check(CLI::Validator(
          [](const std::string& text) -> std::string {
            uint64_t value = 0;
            const auto [end, error] =
                std::from_chars(text.data(), text.data() + text.size(), value);
            if (error == std::errc() && end == text.data() + text.size()) return "";
            return "Value " + text + " is not an integer in 0.." +
                   std::to_string(std::numeric_limits<uint64_t>::max());
          },
          "UINT64"));
  cmd->add_option("--client-io-threads", args->client_io_threads,
                  "ZeroMQ I/O threads of one context all workers share (as one process running "
                  "many workers would); 0: a context per worker")
      ->check(CLI::Range(0, 64));
  cmd->add_option("--driver", args->driver,
                  "Who simulates the workers: events (default: W connections driven from one "
                  "thread, so the host's cores go to the shard, as with workers on hosts of "
                  "their own) or client (W real PsClients on W threads)")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, load::Driver>{{"events", load::Driver::kEvents},
                                              {"client", load::Driver::kClient}},
          CLI::ignore_case));
  cmd->add_flag("--shard-host", args->shard_host,
                "Emulate the shard's own host: its process and the workers' in cgroup v1 CPU "
                "groups of equal shares (root)");
  cmd->add_option("--json", args->json_out, "Write the results as JSON to this file")
      ->check(OutputFile());
  return [args] { return RunLoad(*args); };
}

}  // namespace gridsync::bench
