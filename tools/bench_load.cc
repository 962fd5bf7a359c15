// gridsync-bench load: many workers against ONE PS shard (issue 14, item 2).
// For each --workers count W: a fresh real PsShard in this process and W
// real PsClients, each on its own thread, pushing and pulling sparse rows as
// fast as their acks and replies come back, for --seconds. Reported per W:
// throughput, p50/p99 latency of a push and of a pull, the process's memory
// while the shard serves W workers, and whether anything was dropped.
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
// counter-based RNG keyed by (worker, batch), so every worker and iteration
// touches different rows and workers' batches overlap at random, as a hash
// grid's batches do. Gradients are small, nonzero and drawn the same way.
// --warmup untimed iterations per worker come first (connections made,
// buffers grown); then all W start together.
//
// Latency: each Push call (send + ack) and each SendPull + ReceivePull pair,
// on every worker, merged over workers; p50/p99 by nearest rank. Throughput:
// timed pushes + pulls per second of the timed phase (from the start signal
// until the last worker finished its last operation), and GB/s of payload:
// per row a push carries a 4 B id + 4 x width B of values, and a pull asks
// for a 4 B id and gets 4 x width B back (headers not counted; 24 B per row
// at width 2, as pushpull counts).
//
// Memory: the shard runs in this process, so its memory is read as this
// process's VmRSS and VmHWM (/proc/self/status). The workers' own buffers
// (each holds a whole copy of the table, as a training worker's model does:
// PsClient's pulls write into the whole table) are allocated and written
// before the first reading. Readings per W (the ones between phases after
// malloc_trim, so a phase's freed transients are not the next one's):
//   - rss0: before the shard starts;
//   - shard = after it started and took the initial values - rss0: its
//     state (parameters, gradient buffer and Adam's state, some 4-5 x the
//     table's bytes), its threads and ZeroMQ context;
//   - perW = (ready - rss0 - shard) / W, ready = all W clients connected and
//     warmed up: per worker a PsClient with its own ZeroMQ context (an I/O
//     thread), one TCP connection with ZeroMQ's buffers at each end, the
//     threads' stacks and the malloc arenas of the message buffers; the
//     worker's and the shard's halves cannot be told apart in one process;
//   - grow = the most of VmRSS sampled every 50 ms and VmHWM (reset through
//     /proc/self/clear_refs when the timed phase starts; left out where the
//     kernel refuses) over the timed phase, minus ready: what "bounded" is
//     about, since a queue or a leak grows with the operations served;
//   - after: once the shard and the workers are gone.
// Besides memory the shard's serving_stats() are sampled: pulls held
// waiting (none under async; "wait") and refusals. The shard keeps no queue
// of its own under async: a push is applied and acked in the I/O thread's
// turn; what waits is in ZeroMQ's pipes, and since every worker waits for
// its reply before sending again at most W requests are in flight.
// The CPU the timed phase had is printed too: cores busy in this process
// (getrusage) and in the rest of the host (/proc/stat), since a build
// sharing the cores moves the latencies as much as W does.
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
// Caveat for small hosts: W worker threads, W ZeroMQ I/O threads and the
// shard's threads share the host's cores; with many more threads than cores
// the latency is mostly queueing (a closed loop: latency ~ W x the time
// the shard and the clients spend per operation, Little's law), so p99 is
// compared with linear growth, and the scheduler's time slices add to p99.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
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

#include "common/cluster_map.h"
#include "common/config.h"
#include "common/sharding.h"
#include "common/status.h"
#include "common/wire/message.h"
#include "server/ps_shard.h"
#include "tools/bench.h"
#include "tools/bench_shard_map.h"
#include "worker/ps_client.h"

namespace gridsync::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMaxGap = 5;  // a batch walks its window in gaps of 1..kMaxGap rows
constexpr auto kSamplePeriod = std::chrono::milliseconds(50);
constexpr uint64_t kSlackBytes = uint64_t{8} << 20;  // allocator slack in the memory bound

struct LoadArgs {
  std::vector<uint32_t> workers = {8, 32, 128};
  double seconds = 3.0;
  uint32_t rows = 4096;
  uint32_t width = 2;
  uint64_t table_rows = uint64_t{1} << 18;
  int warmup = 2;
  int timeout_ms = 10000;
  uint64_t seed = 1;
  std::string json_out;
};

// SplitMix64's finaliser: the counter-based RNG (a hash of the counter).
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t Key(uint64_t seed, uint32_t worker, uint64_t batch) {
  return Mix(seed ^ Mix((uint64_t{worker} << 40) ^ batch));
}

// Batch `batch` of worker `worker`: args.rows ascending, distinct row ids.
void MakeBatch(const LoadArgs& args, uint32_t worker, uint64_t batch, std::vector<uint32_t>* rows,
               std::vector<float>* grad) {
  const uint64_t key = Key(args.seed, worker, batch);
  const uint64_t span = uint64_t{args.rows} * kMaxGap;  // the most a batch can cover
  uint64_t row = key % (args.table_rows - span);
  for (uint32_t i = 0; i < args.rows; ++i) {
    const uint64_t h = Mix(key + i + 1);
    (*rows)[i] = static_cast<uint32_t>(row);
    row += 1 + h % kMaxGap;
    for (uint32_t c = 0; c < args.width; ++c) {
      // Nonzero, in [-0.01, -0.001] U [0.001, 0.01]; a hash per column, so
      // any width shifts within 64 bits.
      const uint64_t hc = Mix(h ^ (uint64_t{c} << 32));
      const float magnitude = 0.001f + 0.009f * static_cast<float>((hc >> 16) & 0xFF) / 255.0f;
      (*grad)[size_t{i} * args.width + c] = ((hc >> 8) & 1) != 0 ? magnitude : -magnitude;
    }
  }
}

float InitialValue(uint64_t row, uint32_t col) {
  const uint32_t h = static_cast<uint32_t>(Mix(row * 64 + col));
  return static_cast<float>(h >> 16) / 65536.0f * 1e-2f - 0.5e-2f;
}

struct Memory {
  uint64_t rss = 0;  // bytes
  uint64_t hwm = 0;
};

Memory ReadMemory() {
  Memory m;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    std::istringstream in(line);
    std::string key;
    uint64_t kb = 0;
    in >> key >> kb;
    if (key == "VmRSS:") m.rss = kb << 10;
    if (key == "VmHWM:") m.hwm = kb << 10;
  }
  return m;
}

// VmRSS once the allocator returned what it holds free (glibc keeps freed
// memory in its arenas): for the readings between phases, so a phase's
// transient buffers (the init push's whole table) do not count as the next
// phase's memory.
uint64_t TrimmedRss() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
  return ReadMemory().rss;
}

// Resets VmHWM to the current VmRSS (Linux 4.0+); false where not allowed.
bool ResetPeak() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

// CPU seconds: the host's busy time (every core, /proc/stat) and this
// process's (getrusage). Over the timed phase they tell how much of the
// cores this run had and how much went to other processes (a compiler
// sharing the host), which moves the latencies as much as W does.
struct CpuTimes {
  double host_busy = 0;
  double self = 0;
};

CpuTimes ReadCpu() {
  CpuTimes t;
  std::ifstream stat("/proc/stat");
  std::string cpu;
  uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  if (cpu == "cpu" && tick > 0) {
    t.host_busy = static_cast<double>(user + nice + system + irq + softirq + steal) / tick;
  }
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    auto seconds = [](const timeval& tv) {
      return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6;
    };
    t.self = seconds(usage.ru_utime) + seconds(usage.ru_stime);
  }
  return t;
}

double MiB(double bytes) { return bytes / (1 << 20); }

struct Latency {
  double p50_us = 0;
  double p99_us = 0;
};

Latency Percentiles(std::vector<float> us) {
  if (us.empty()) return {std::nan(""), std::nan("")};
  std::sort(us.begin(), us.end());
  auto rank = [&](double p) {  // nearest rank
    const size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(us.size())));
    return static_cast<double>(us[std::clamp<size_t>(k, 1, us.size()) - 1]);
  };
  return {rank(0.50), rank(0.99)};
}

// One simulated worker: its buffers (allocated and written before the
// memory baseline) and what it measured.
struct Worker {
  std::vector<float> table;  // the pull destination: the whole table
  std::vector<uint32_t> rows, next_rows;
  std::vector<float> grad, next_grad;
  std::vector<float> push_us, pull_us;       // timed phase
  uint64_t pushes_sent = 0, pulls_sent = 0;  // every phase; sent = attempted
  uint64_t timed_pushes = 0, timed_pulls = 0;
  uint64_t failures = 0;   // pushes or pulls that returned an error (timeouts too)
  uint64_t bad_pulls = 0;  // pull replies that left a pulled value unwritten
  std::string first_error;
};

// Start line for the workers: each reports ready after its warmup and waits
// (with a deadline) for go; stop ends the timed loops.
struct Control {
  std::mutex mu;
  std::condition_variable cv;
  uint32_t ready = 0;
  bool go = false;
  std::atomic<bool> stop{false};
};

void Record(Worker* w, const Status& s, const char* what) {
  ++w->failures;
  if (w->first_error.empty()) w->first_error = std::string(what) + ": " + s.ToString();
}

// One iteration: push batch `step`, then pull batch step + 1 (which becomes
// the next push's batch). Returns false when the worker should give up
// (repeated failures, so a dead shard does not cost timeout after timeout).
bool Iterate(const LoadArgs& args, uint32_t rank, PsClient& client, uint64_t step, bool timed,
             Worker* w) {
  const auto t0 = Clock::now();
  ++w->pushes_sent;
  const Status pushed = client.Push(wire::Kind::kPush, step,
                                    {{0, false, w->rows.data(), w->rows.size(), w->grad.data()}});
  const auto t1 = Clock::now();
  if (!pushed.ok()) Record(w, pushed, "push");

  MakeBatch(args, rank, step + 1, &w->next_rows, &w->next_grad);
  for (uint32_t row : w->next_rows) {
    for (uint32_t c = 0; c < args.width; ++c) {
      w->table[size_t{row} * args.width + c] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  const auto t2 = Clock::now();
  ++w->pulls_sent;
  Status pulled =
      client.SendPull(0, {{0, false, w->next_rows.data(), w->next_rows.size(), w->table.data()}},
                      /*whole=*/false, /*for_step=*/step + 1);
  if (pulled.ok()) pulled = client.ReceivePull().status();
  const auto t3 = Clock::now();
  if (!pulled.ok()) {
    Record(w, pulled, "pull");
  } else {
    bool written = true;
    for (uint32_t row : w->next_rows) {
      for (uint32_t c = 0; c < args.width; ++c) {
        written = written && std::isfinite(w->table[size_t{row} * args.width + c]);
      }
    }
    if (!written) ++w->bad_pulls;
  }
  if (timed) {
    if (pushed.ok()) {
      ++w->timed_pushes;
      w->push_us.push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
    }
    if (pulled.ok()) {
      ++w->timed_pulls;
      w->pull_us.push_back(std::chrono::duration<float, std::micro>(t3 - t2).count());
    }
  }
  std::swap(w->rows, w->next_rows);
  std::swap(w->grad, w->next_grad);
  return w->failures < 3;
}

void RunWorker(const LoadArgs& args, const Partition& partition, const ClusterMap& map,
               uint32_t rank, uint32_t n, Clock::time_point go_deadline, Control* control,
               Worker* w) {
  auto signal_ready = [&] {
    std::lock_guard<std::mutex> lock(control->mu);
    ++control->ready;
    control->cv.notify_all();
  };
  const auto timeout = std::chrono::milliseconds(args.timeout_ms);
  auto client = PsClient::Connect(map, partition, rank, n, timeout);
  if (!client.ok()) {
    Record(w, client.status(), "connect");
    signal_ready();
    return;
  }
  uint64_t step = 0;
  MakeBatch(args, rank, step, &w->rows, &w->grad);
  bool alive = true;
  for (int i = 0; i < args.warmup && alive; ++i) {
    alive = Iterate(args, rank, **client, step++, /*timed=*/false, w);
  }
  signal_ready();
  if (!alive) return;
  {
    std::unique_lock<std::mutex> lock(control->mu);
    if (!control->cv.wait_until(lock, go_deadline, [&] { return control->go; })) {
      Record(w, Status::Timeout("no start signal"), "start");
      return;
    }
  }
  while (alive && !control->stop.load(std::memory_order_relaxed)) {
    alive = Iterate(args, rank, **client, step++, /*timed=*/true, w);
  }
}

struct WorkerCountResult {
  uint32_t workers = 0;
  double seconds = 0;              // timed phase, measured
  uint64_t pushes = 0, pulls = 0;  // timed, completed
  Latency push, pull;
  double ops_per_s = 0, gbps = 0;
  uint64_t rss0 = 0, rss_shard = 0, rss_ready = 0, rss_max = 0, rss_end = 0, hwm = 0, rss_after = 0;
  bool ran = false;  // reached its timed phase
  bool hwm_reset = false;
  double self_cpu = 0, other_cpu = 0;  // cores busy over the timed phase: this process, the rest
  uint64_t memory_bound = 0;           // allowed growth over the timed phase
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

uint64_t AbsDiff(uint64_t a, uint64_t b) { return a > b ? a - b : b - a; }

WorkerCountResult RunWorkers(const LoadArgs& args, const Partition& partition,
                             const std::vector<TableInfo>& tables, uint32_t n,
                             const std::vector<float>& initial) {
  WorkerCountResult r;
  r.workers = n;
  auto fail = [&](const Status& s) {
    ++r.errors;
    if (r.first_error.empty()) r.first_error = s.ToString();
    return r;
  };

  // The workers' buffers first, written, so the readings below see the
  // shard and the connections, not these.
  std::vector<Worker> workers(n);
  for (auto& w : workers) {
    w.table = initial;
    w.rows.resize(args.rows);
    w.next_rows.resize(args.rows);
    w.grad.resize(size_t{args.rows} * args.width);
    w.next_grad.resize(w.grad.size());
    const size_t expected = static_cast<size_t>(args.seconds * 4000) + 64;  // grows if needed
    w.push_us.reserve(expected);
    w.pull_us.reserve(expected);
  }
  r.rss0 = TrimmedRss();

  const auto timeout = std::chrono::milliseconds(args.timeout_ms);
  ShardOptions options;
  options.endpoint = "tcp://127.0.0.1:0";
  options.workers = n;
  options.consistency = Consistency::kAsync;
  options.timeout = timeout;
  auto shard = PsShard::Start(partition, options);
  if (!shard.ok()) return fail(shard.status().WithContext("shard"));

  const ClusterMap map = OneShardMap((*shard)->endpoint(), tables, n);
  {
    // The initial values, once, as rank 0 of a training run pushes them.
    auto init = PsClient::Connect(map, partition, 0, n, timeout);
    if (!init.ok()) return fail(init.status().WithContext("init client"));
    if (auto s =
            (*init)->Push(wire::Kind::kInit, 0, {{0, true, nullptr, 0, workers[0].table.data()}});
        !s.ok()) {
      return fail(s.WithContext("init"));
    }
  }
  r.rss_shard = TrimmedRss();

  Control control;
  // Connecting and the warmup: each warmup iteration has two waits of at
  // most the timeout; the workers share the cores.
  const auto ready_deadline =
      Clock::now() + timeout * (2 * args.warmup + 1) + std::chrono::seconds(30);
  const auto go_deadline = ready_deadline + std::chrono::seconds(10);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (uint32_t rank = 0; rank < n; ++rank) {
    threads.emplace_back(RunWorker, std::cref(args), std::cref(partition), std::cref(map), rank, n,
                         go_deadline, &control, &workers[rank]);
  }
  bool all_ready = false;
  {
    std::unique_lock<std::mutex> lock(control.mu);
    all_ready = control.cv.wait_until(lock, ready_deadline, [&] { return control.ready == n; });
  }
  if (!all_ready) {
    ++r.errors;
    r.first_error = "workers not ready after their warmup by the deadline";
  }
  r.rss_ready = r.rss_max = ReadMemory().rss;
  r.ran = true;
  r.hwm_reset = ResetPeak();  // VmHWM from here: the timed phase's peak
  const CpuTimes cpu0 = ReadCpu();
  const auto start = Clock::now();
  {
    std::lock_guard<std::mutex> lock(control.mu);
    control.go = true;
  }
  control.cv.notify_all();
  const auto end = start + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(args.seconds));
  while (Clock::now() < end) {
    std::this_thread::sleep_for(std::min<Clock::duration>(kSamplePeriod, end - Clock::now()));
    r.rss_max = std::max(r.rss_max, ReadMemory().rss);
    r.max_waiting_pulls = std::max(r.max_waiting_pulls, (*shard)->serving_stats().waiting_pulls);
  }
  control.stop = true;
  // Every wait of a worker has a deadline, so these joins end.
  for (auto& t : threads) t.join();
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const CpuTimes cpu1 = ReadCpu();
  r.self_cpu = (cpu1.self - cpu0.self) / r.seconds;
  r.other_cpu =
      std::max(0.0, (cpu1.host_busy - cpu0.host_busy) - (cpu1.self - cpu0.self)) / r.seconds;
  const Memory after_load = ReadMemory();
  r.rss_end = after_load.rss;
  r.hwm = after_load.hwm;
  r.rss_max = std::max(r.rss_max, r.rss_end);

  uint64_t sent_pushes = 0, sent_pulls = 0;
  for (const auto& w : workers) {
    sent_pushes += w.pushes_sent;
    sent_pulls += w.pulls_sent;
  }
  // Every reply came back unless something failed; then requests may still
  // sit in the shard's pipes: give it a moment (bounded) to count them.
  wire::ShardStats stats = (*shard)->stats();
  const auto settle = Clock::now() + std::chrono::seconds(2);
  while ((stats.pushes < sent_pushes || stats.pulls < sent_pulls) && Clock::now() < settle) {
    std::this_thread::sleep_for(kSamplePeriod);
    stats = (*shard)->stats();
  }
  const ServingStats serving = (*shard)->serving_stats();
  r.shard_pushes = stats.pushes;
  r.shard_applied = stats.applied_steps;
  r.shard_pulls = stats.pulls;
  r.shard_errors = stats.errors;
  for (const auto& [reason, count] : serving.refusals) r.refusals += count;

  std::vector<float> push_us, pull_us;
  r.sent_pushes = sent_pushes;
  r.sent_pulls = sent_pulls;
  for (auto& w : workers) {
    r.pushes += w.timed_pushes;
    r.pulls += w.timed_pulls;
    r.errors += w.failures + w.bad_pulls;
    if (r.first_error.empty() && !w.first_error.empty()) r.first_error = w.first_error;
    push_us.insert(push_us.end(), w.push_us.begin(), w.push_us.end());
    pull_us.insert(pull_us.end(), w.pull_us.begin(), w.pull_us.end());
  }
  r.errors += r.shard_errors + r.refusals;
  r.dropped = AbsDiff(r.sent_pushes, r.shard_pushes) + AbsDiff(r.sent_pushes, r.shard_applied) +
              AbsDiff(r.sent_pulls, r.shard_pulls);
  r.push = Percentiles(std::move(push_us));
  r.pull = Percentiles(std::move(pull_us));
  r.ops_per_s = static_cast<double>(r.pushes + r.pulls) / r.seconds;
  const double bytes_per_row = 2.0 * (sizeof(uint32_t) + args.width * sizeof(float));
  r.gbps = static_cast<double>(r.pushes) * args.rows * bytes_per_row / r.seconds / 1e9;

  // At most one request per worker in flight; bounded by a push, a pull
  // request and its reply all at once.
  const uint64_t in_flight = uint64_t{args.rows} * (2 * sizeof(uint32_t) + 2 * args.width * 4);
  r.memory_bound = n * in_flight + kSlackBytes;

  (*shard)->Stop();
  shard->reset();
  workers.clear();
  workers.shrink_to_fit();
  r.rss_after = TrimmedRss();
  return r;
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
  }
  if (args.rows == 0 || args.width == 0) return BadArgs("--rows and --width must be >= 1");
  if (args.table_rows > std::numeric_limits<uint32_t>::max() ||
      args.table_rows <= uint64_t{args.rows} * kMaxGap) {
    return BadArgs("--table-rows " + std::to_string(args.table_rows) + "; allowed: more than " +
                   std::to_string(kMaxGap) + " x --rows (" +
                   std::to_string(uint64_t{args.rows} * kMaxGap) + ") and below 2^32");
  }
  if (!(args.seconds > 0 && args.seconds <= 600)) return BadArgs("--seconds: allowed (0, 600]");
  if (args.timeout_ms <= 0) return BadArgs("--timeout-ms must be > 0");

  const std::vector<TableInfo> tables = {{"level", args.table_rows, args.width}};
  auto made = Partition::Make(tables, 1, ModelParallelDim::kRow);
  if (!made.ok()) {
    std::fprintf(stderr, "gridsync-bench load: %s\n", made.status().ToString().c_str());
    return 1;
  }
  // The shards and clients keep references to it: it stays put from here.
  const Partition partition = std::move(made).value();
  const uint32_t w_min = *std::min_element(args.workers.begin(), args.workers.end());
  std::vector<float> initial(args.table_rows * args.width);
  for (uint64_t row = 0; row < args.table_rows; ++row) {
    for (uint32_t c = 0; c < args.width; ++c) initial[row * args.width + c] = InitialValue(row, c);
  }
  const double push_bytes = args.rows * (sizeof(uint32_t) + args.width * 4.0);

  std::printf(
      "# gridsync-bench load: 1 PS shard (async: each push one Adam step on arrival, pulls never "
      "wait; %d shard threads) in this process on tcp://127.0.0.1, W PsClient workers on W "
      "threads; table %llu rows x %u floats; %u rows per push and per pull (sorted distinct ids, "
      "a random window walked in gaps of 1..%u, per worker and iteration); %.1f s per W after %d "
      "warmup iterations per worker; timeout %d ms; %u cores\n",
      ShardOptions{}.threads, static_cast<unsigned long long>(args.table_rows), args.width,
      args.rows, kMaxGap, args.seconds, args.warmup, args.timeout_ms,
      std::thread::hardware_concurrency());
  std::printf(
      "# per iteration: Push (send + ack; push_*) then SendPull + ReceivePull of the next batch "
      "(pull_*); p50/p99 by nearest rank over all workers; kops/s = (pushes + pulls) / s; GB/s = "
      "payload (%.0f B push + %.0f B pull per iteration; headers not counted) / s\n",
      push_bytes, push_bytes);
  std::printf(
      "# memory (MiB, of this whole process: the shard is in-process; the workers' table copies "
      "are allocated before rss0): rss0 before the shard; shard = after its start and the init "
      "push - rss0; perW_KiB = (ready - rss0 - shard) / W, ready = all W clients connected and "
      "warmed up; grow = max(VmRSS sampled every 50 ms, VmHWM) over the timed phase - ready; "
      "bound = W x (push + pull request + pull reply) + %.0f; after = VmRSS once the shard and "
      "the workers are gone (malloc_trim)\n",
      MiB(kSlackBytes));
  std::printf(
      "# #drop = |pushes sent - shard's pushes| + |pushes sent - shard's applied steps| + |pulls "
      "sent - shard's pulls|; #err = failed or timed-out pushes and pulls + pulls leaving a row "
      "unwritten + shard errors and refusals; wait = most pulls the shard held; cpu = cores busy "
      "in this process, other = in the rest of the host, over the timed phase; p99x = p99(W) / "
      "p99(W=%u), push and pull; Wx = W / %u; linear = both p99x <= Wx; Lx = Wx x kops/s(W=%u) / "
      "kops/s(W), the latency ratio a closed loop's queueing gives (Little's law; information: "
      "above Wx when W gets less throughput, e.g. cores taken by other processes)\n",
      w_min, w_min, w_min);
  std::printf(
      "#%5s %5s %7s %9s %9s %9s %9s %7s %6s %6s %6s %8s %8s %6s %6s %6s %4s %5s %5s %5s %5s "
      "%9s %9s %6s %6s %6s\n",
      "W", "secs", "iters", "push_p50", "push_p99", "pull_p50", "pull_p99", "kops/s", "GB/s",
      "rss0", "shard", "perW_KiB", "grow", "bound", "hwm", "after", "wait", "#drop", "#err", "cpu",
      "other", "p99x_push", "p99x_pull", "Wx", "linear", "Lx");
  std::fflush(stdout);

  // The rows are printed once all ran: the ratios need W_min's row.
  std::vector<WorkerCountResult> results;
  for (uint32_t n : args.workers) {
    std::fprintf(stderr, "gridsync-bench load: %u workers...\n", n);
    results.push_back(RunWorkers(args, partition, tables, n, initial));
  }
  const WorkerCountResult* base =
      &*std::find_if(results.begin(), results.end(),
                     [&](const WorkerCountResult& r) { return r.workers == w_min; });
  bool all_linear = true, all_memory = true;
  uint64_t dropped = 0, errors = 0;
  for (auto& r : results) {
    if (!r.ran) {  // failed before its timed phase: the details line says why
      std::printf("%6u did not run\n", r.workers);
      all_linear = all_memory = false;
      errors += r.errors;
      continue;
    }
    r.worker_ratio = static_cast<double>(r.workers) / w_min;
    r.little_ratio = r.worker_ratio * base->ops_per_s / r.ops_per_s;
    r.push_p99_ratio = r.push.p99_us / base->push.p99_us;
    r.pull_p99_ratio = r.pull.p99_us / base->pull.p99_us;
    // A tiny tolerance: the base row's own ratios are exactly 1.
    r.linear = r.push_p99_ratio <= r.worker_ratio * (1 + 1e-9) &&
               r.pull_p99_ratio <= r.worker_ratio * (1 + 1e-9);
    all_linear = all_linear && r.linear;
    all_memory = all_memory && r.memory_ok();
    dropped += r.dropped;
    errors += r.errors;
    const double shard_mib = MiB(static_cast<double>(r.rss_shard) - static_cast<double>(r.rss0));
    const double per_worker_kib =
        (static_cast<double>(r.rss_ready) - static_cast<double>(r.rss_shard)) / 1024.0 / r.workers;
    std::printf(
        "%6u %5.2f %7llu %9.0f %9.0f %9.0f %9.0f %7.2f %6.3f %6.1f %6.1f %8.0f %8.2f %6.1f %6.1f "
        "%6.1f %4llu %5llu %5llu %5.2f %5.2f %9.2f %9.2f %6.1f %6s %6.1f\n",
        r.workers, r.seconds, static_cast<unsigned long long>(r.pushes), r.push.p50_us,
        r.push.p99_us, r.pull.p50_us, r.pull.p99_us, r.ops_per_s / 1e3, r.gbps,
        MiB(static_cast<double>(r.rss0)), shard_mib, per_worker_kib,
        MiB(static_cast<double>(r.growth())), MiB(static_cast<double>(r.memory_bound)),
        MiB(static_cast<double>(r.hwm)), MiB(static_cast<double>(r.rss_after)),
        static_cast<unsigned long long>(r.max_waiting_pulls),
        static_cast<unsigned long long>(r.dropped), static_cast<unsigned long long>(r.errors),
        r.self_cpu, r.other_cpu, r.push_p99_ratio, r.pull_p99_ratio, r.worker_ratio,
        r.linear ? "PASS" : "FAIL", r.little_ratio);
  }
  // Details after the table, so the rows stay one block.
  for (const auto& r : results) {
    std::printf(
        "# W=%u: shard counted pushes %llu, applied steps %llu, pulls %llu, errors %llu, refusals "
        "%llu; workers sent pushes %llu, pulls %llu (warmup included; timed: %llu each); VmHWM "
        "%s%s%s\n",
        r.workers, static_cast<unsigned long long>(r.shard_pushes),
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
  const auto& top = *std::find_if(results.begin(), results.end(),
                                  [&](const WorkerCountResult& r) { return r.workers == w_max; });
  std::printf(
      "# targets: nothing dropped: %s (#drop %llu, #err %llu over all W); memory bounded: %s "
      "(grow within bound for every W; per added worker %.0f KiB at W=%u: its client's ZeroMQ "
      "context and threads, one TCP connection's buffers on each side, malloc arenas of its "
      "messages; not growing with the operations); p99 no faster than linear in W: %s\n",
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
                       {"cores", std::thread::hardware_concurrency()},
                       {"payload_bytes_per_iteration", 2 * push_bytes}};
    out["rows"] = nlohmann::json::array();
    for (const auto& r : results) {
      out["rows"].push_back({{"workers", r.workers},
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
                             {"cpu_self_cores", r.self_cpu},
                             {"cpu_other_cores", r.other_cpu},
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
  cmd->add_option("--seconds", args->seconds, "Timed seconds per worker count");
  cmd->add_option("--rows", args->rows, "Rows per push and per pull");
  cmd->add_option("--width", args->width, "Floats per row (a hash-grid level: 2)");
  cmd->add_option("--table-rows", args->table_rows, "Rows of the table");
  cmd->add_option("--warmup", args->warmup, "Untimed iterations per worker")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--timeout-ms", args->timeout_ms, "Timeout of every push and pull wait");
  cmd->add_option("--seed", args->seed, "Seed of the batches' row ids and gradients");
  cmd->add_option("--json", args->json_out, "Write the results as JSON to this file");
  return [args] { return RunLoad(*args); };
}

}  // namespace gridsync::bench
