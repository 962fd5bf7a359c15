// The many-workers run of gridsync-bench load (bench_load.h): one PsShard
// in a forked process (bench_load_shard.h), W simulated workers here (W
// real PsClient threads, or the events driver: bench_load_worker.h), and
// the shard's memory and CPU read from its /proc while they run.
//
// Thread safety: see bench_load.h.
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

#include "common/cluster_map.h"
#include "common/config.h"
#include "common/file_limit.h"
#include "common/huge_pages.h"
#include "common/sharding.h"
#include "common/status.h"
#include "common/wire/message.h"
#include "server/ps_shard.h"
#include "tools/bench_cpu.h"
#include "tools/bench_load.h"
#include "tools/bench_load_shard.h"
#include "tools/bench_load_worker.h"
#include "tools/bench_shard_map.h"
#include "tools/cpu_groups.h"
#include "worker/ps_client.h"

namespace gridsync::bench::load {
namespace {

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

float InitialValueOf(uint64_t row, uint32_t col) {
  const uint32_t h = static_cast<uint32_t>(Mix(row * 64 + col));
  return static_cast<float>(h >> 16) / 65536.0f * 1e-2f - 0.5e-2f;
}

}  // namespace

Batch MakeBatch(const LoadArgs& args, uint64_t index) {
  Batch b;
  b.rows.resize(args.rows);
  b.grad.resize(size_t{args.rows} * args.width);
  const uint64_t key = Mix(args.seed ^ Mix(index));
  const uint64_t span = uint64_t{args.rows} * kMaxGap;  // the most a batch can cover
  uint64_t row = key % (args.table_rows - span);
  for (uint32_t i = 0; i < args.rows; ++i) {
    const uint64_t h = Mix(key + i + 1);
    b.rows[i] = static_cast<uint32_t>(row);
    row += 1 + h % kMaxGap;
    for (uint32_t c = 0; c < args.width; ++c) {
      // Nonzero, in [-0.01, -0.001] U [0.001, 0.01]; a hash per column, so
      // any width shifts within 64 bits.
      const uint64_t hc = Mix(h ^ (uint64_t{c} << 32));
      const float magnitude = 0.001f + 0.009f * static_cast<float>((hc >> 16) & 0xFF) / 255.0f;
      b.grad[size_t{i} * args.width + c] = ((hc >> 8) & 1) != 0 ? magnitude : -magnitude;
    }
  }
  return b;
}

const Batch& PickBatch(const LoadArgs& args, const std::vector<Batch>& pool, uint32_t worker,
                       uint64_t step) {
  return pool[Key(args.seed, worker, step) % pool.size()];
}

void RecordFailure(WorkerStats* w, const Status& s, const char* what) {
  ++w->failures;
  if (w->first_error.empty()) w->first_error = std::string(what) + ": " + s.ToString();
}

namespace {

Latency Percentiles(std::vector<float> us) {
  if (us.empty()) return {std::nan(""), std::nan("")};
  std::sort(us.begin(), us.end());
  auto rank = [&](double p) {  // nearest rank
    const size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(us.size())));
    return static_cast<double>(us[std::clamp<size_t>(k, 1, us.size()) - 1]);
  };
  return {rank(0.50), rank(0.99)};
}

// A client-driver worker's pull destination: the whole table, on huge
// pages as the training worker's grid (worker/model.cc): W tables of 4 KiB
// pages would spend the host's TLB on the bench, not on the shard.
using WorkerTable = HugePageVector<float>;

// One iteration: push batch `step`, then pull batch step + 1 (which becomes
// the next push's batch). Returns false when the worker should give up
// (repeated failures, so a dead shard does not cost timeout after timeout).
bool Iterate(const LoadArgs& args, const std::vector<Batch>& pool, uint32_t rank, PsClient& client,
             uint64_t step, bool timed, WorkerStats* w, WorkerTable* table) {
  const Batch& batch = PickBatch(args, pool, rank, step);
  const auto t0 = Clock::now();
  ++w->pushes_sent;
  const Status pushed =
      client.Push(wire::Kind::kPush, step,
                  {{0, false, batch.rows.data(), batch.rows.size(), batch.grad.data()}});
  const auto t1 = Clock::now();
  if (!pushed.ok()) RecordFailure(w, pushed, "push");

  const Batch& next = PickBatch(args, pool, rank, step + 1);
  for (uint32_t row : next.rows) {
    for (uint32_t c = 0; c < args.width; ++c) {
      (*table)[size_t{row} * args.width + c] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  const auto t2 = Clock::now();
  ++w->pulls_sent;
  Status pulled =
      client.SendPull(0, {{0, false, next.rows.data(), next.rows.size(), table->data()}},
                      /*whole=*/false, /*for_step=*/step + 1);
  if (pulled.ok()) pulled = client.ReceivePull().status();
  const auto t3 = Clock::now();
  if (!pulled.ok()) {
    RecordFailure(w, pulled, "pull");
  } else {
    bool written = true;
    for (uint32_t row : next.rows) {
      for (uint32_t c = 0; c < args.width; ++c) {
        written = written && std::isfinite((*table)[size_t{row} * args.width + c]);
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
  return w->failures < kMaxFailures;
}

void RunWorker(const LoadArgs& args, const std::vector<Batch>& pool, const Partition& partition,
               const ClusterMap& map, std::shared_ptr<zmq::context_t> context, uint32_t rank,
               uint32_t n, Clock::time_point go_deadline, Control* control, WorkerStats* w,
               WorkerTable* table) {
  auto signal_ready = [&] {
    std::lock_guard<std::mutex> lock(control->mu);
    ++control->ready;
    control->cv.notify_all();
  };
  const auto timeout = std::chrono::milliseconds(args.timeout_ms);
  auto client = PsClient::Connect(map, partition, rank, n, timeout, {}, {}, std::move(context));
  if (!client.ok()) {
    RecordFailure(w, client.status(), "connect");
    signal_ready();
    return;
  }
  uint64_t step = 0;
  bool alive = true;
  for (int i = 0; i < args.warmup && alive; ++i) {
    alive = Iterate(args, pool, rank, **client, step++, /*timed=*/false, w, table);
  }
  signal_ready();
  if (!alive) return;
  {
    std::unique_lock<std::mutex> lock(control->mu);
    if (!control->cv.wait_until(lock, go_deadline, [&] { return control->go; })) {
      RecordFailure(w, Status::Timeout("no start signal"), "start");
      return;
    }
  }
  while (alive && !control->stop.load(std::memory_order_relaxed)) {
    alive = Iterate(args, pool, rank, **client, step++, /*timed=*/true, w, table);
  }
}

uint64_t AbsDiff(uint64_t a, uint64_t b) { return a > b ? a - b : b - a; }

}  // namespace

float InitialValue(uint64_t row, uint32_t col) { return InitialValueOf(row, col); }

WorkerCountResult RunWorkers(const LoadArgs& args, const Partition& partition,
                             const std::vector<TableInfo>& tables, uint32_t n,
                             const std::vector<float>& initial, CpuGroups* groups) {
  WorkerCountResult r;
  r.workers = n;
  auto fail = [&](const Status& s) {
    ++r.errors;
    if (r.first_error.empty()) r.first_error = s.ToString();
    return r;
  };

  // The shard first, while this process has one thread, and before the
  // workers' buffers, which the child would otherwise count as its own.
  const auto timeout = std::chrono::milliseconds(args.timeout_ms);
  auto shard = ShardProcess::Fork(partition, n, timeout);
  if (!shard.ok()) return fail(shard.status());
  if (groups != nullptr) {
    if (Status joined = groups->Join("shard", (*shard)->pid()); !joined.ok())
      return fail(joined.WithContext("the shard's CPU group"));
  }
  r.rss0 = (*shard)->at_start().rss;

  std::vector<Batch> pool;
  pool.reserve(kBatchPool);
  for (uint32_t i = 0; i < kBatchPool; ++i) pool.push_back(MakeBatch(args, i));
  const bool events = args.driver == Driver::kEvents;
  std::vector<WorkerStats> workers(n);
  for (auto& w : workers) {
    const size_t expected = static_cast<size_t>(args.seconds * 4000) + 64;  // grows if needed
    w.push_us.reserve(expected);
    w.pull_us.reserve(expected);
  }
  // The client driver's pull destinations (the events driver checks the
  // replies' values as they come).
  std::vector<WorkerTable> worker_tables(events ? 0 : n);
  for (auto& t : worker_tables) t.assign(initial.begin(), initial.end());

  const ClusterMap map = OneShardMap((*shard)->endpoint(), tables, n);
  {
    // The initial values, once, as rank 0 of a training run pushes them.
    auto init = PsClient::Connect(map, partition, 0, n, timeout);
    if (!init.ok()) return fail(init.status().WithContext("init client"));
    if (auto s = (*init)->Push(wire::Kind::kInit, 0, {{0, true, nullptr, 0, initial.data()}});
        !s.ok()) {
      return fail(s.WithContext("init"));
    }
  }
  auto with_shard = (*shard)->TrimAndRead();
  if (!with_shard.ok()) return fail(with_shard.status());
  r.rss_shard = with_shard->rss;

  std::shared_ptr<zmq::context_t> context;
  if (args.client_io_threads > 0 || events) {
    // The events driver's connections share one context (its I/O threads
    // at least one).
    context = std::make_shared<zmq::context_t>(std::max(args.client_io_threads, 1));
    // Three sockets per worker (its DEALER, and the pair of its handshake
    // monitor: wire/handshake_watch.h); ZeroMQ's default cap is 1023 a
    // context.
    context->set(zmq::ctxopt::max_sockets, 3 * static_cast<int>(n) + 16);
  }
  std::vector<wire::TableShape> shapes;
  for (const auto& t : tables) shapes.push_back({t.rows, t.width});
  Control control;
  // Connecting and the warmup: each warmup iteration has two waits of at
  // most the timeout; the workers share the cores.
  const auto ready_deadline =
      Clock::now() + timeout * (2 * args.warmup + 1) + std::chrono::seconds(30);
  const auto go_deadline = ready_deadline + std::chrono::seconds(10);
  std::vector<std::thread> threads;
  if (events) {
    threads.emplace_back(RunEventWorkers, std::cref(args), std::cref(pool), std::cref(map),
                         std::cref(shapes), n, std::ref(*context), go_deadline, &control, &workers);
  } else {
    threads.reserve(n);
    for (uint32_t rank = 0; rank < n; ++rank) {
      threads.emplace_back(RunWorker, std::cref(args), std::cref(pool), std::cref(partition),
                           std::cref(map), context, rank, n, go_deadline, &control, &workers[rank],
                           &worker_tables[rank]);
    }
  }
  // Every wait of a worker has a deadline, so these joins end.
  auto join = [&] {
    control.stop = true;
    {
      std::lock_guard<std::mutex> lock(control.mu);
      control.go = true;  // a worker still at the start line leaves at once
    }
    control.cv.notify_all();
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
  };
  bool all_ready = false;
  {
    std::unique_lock<std::mutex> lock(control.mu);
    all_ready = control.cv.wait_until(lock, ready_deadline, [&] { return control.ready == n; });
  }
  if (!all_ready) {
    ++r.errors;
    r.first_error = "workers not ready after their warmup by the deadline";
  }
  // VmHWM from here: the timed phase's peak.
  auto ready = (*shard)->ResetPeak();
  if (!ready.ok()) {
    join();
    return fail(ready.status());
  }
  r.rss_ready = r.rss_max = ready->rss;
  r.hwm_reset = ready->hwm_reset;
  r.ran = true;
  const CpuTimes cpu0 = ReadCpu();
  const double shard_cpu0 = ready->cpu_seconds;
  const auto start = Clock::now();
  {
    std::lock_guard<std::mutex> lock(control.mu);
    control.go = true;
  }
  control.cv.notify_all();
  const auto end = start + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(args.seconds));
  Status sampling;
  while (Clock::now() < end && sampling.ok()) {
    std::this_thread::sleep_for(std::min<Clock::duration>(kSamplePeriod, end - Clock::now()));
    auto reading = (*shard)->Read();
    if (!reading.ok()) {
      sampling = reading.status();
      break;
    }
    r.rss_max = std::max(r.rss_max, reading->rss);
    r.max_waiting_pulls = std::max(r.max_waiting_pulls, reading->waiting_pulls);
  }
  join();
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const CpuTimes cpu1 = ReadCpu();
  if (!sampling.ok()) {
    r.ran = false;  // no figures: the details line says why
    return fail(sampling);
  }

  uint64_t sent_pushes = 0, sent_pulls = 0;
  for (const auto& w : workers) {
    sent_pushes += w.pushes_sent;
    sent_pulls += w.pulls_sent;
  }
  // Every reply came back unless something failed; then requests may still
  // sit in the shard's pipes: give it a moment (bounded) to count them.
  auto last = (*shard)->Read();
  // The shard's CPU over the same window as the host's (cpu1 was read just
  // before): not the settling below.
  const double shard_cpu1 = last.ok() ? last->cpu_seconds : 0;
  const auto settle = Clock::now() + std::chrono::seconds(2);
  while (last.ok() && (last->pushes < sent_pushes || last->pulls < sent_pulls) &&
         Clock::now() < settle) {
    std::this_thread::sleep_for(kSamplePeriod);
    last = (*shard)->Read();
  }
  if (!last.ok()) {
    r.ran = false;  // no figures: the details line says why
    return fail(last.status());
  }
  // Cores busy: the shard's process, this one (the workers), and the rest
  // of the host (a compiler sharing the host moves the latencies as much as
  // W does).
  const CpuUse cpu = CpuBetween(cpu0, cpu1);
  r.shard_cpu = (shard_cpu1 - shard_cpu0) / r.seconds;
  r.worker_cpu = cpu.self_seconds / r.seconds;
  const double other = cpu.other_seconds / r.seconds - r.shard_cpu;
  r.other_cpu = std::isnan(other) ? other : std::max(0.0, other);  // NaN: not read
  r.rss_end = last->rss;
  r.hwm = last->hwm;
  r.rss_max = std::max(r.rss_max, r.rss_end);
  r.shard_pushes = last->pushes;
  r.shard_applied = last->applied_steps;
  r.shard_pulls = last->pulls;
  r.shard_errors = last->errors;
  r.refusals = last->refusals;

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

  // The workers' clients close with their threads' ends; their context
  // with the last reference.
  context.reset();
  worker_tables.clear();
  worker_tables.shrink_to_fit();
  // What the shard keeps once its W connections closed (they close a
  // moment after the clients).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto after = (*shard)->TrimAndRead();
  if (!after.ok()) return fail(after.status());  // how the shard process ended, named
  r.rss_after = after->rss;
  if (auto s = (*shard)->Stop(); !s.ok()) return fail(s);
  return r;
}

double MiB(double bytes) { return bytes / (1 << 20); }

// EnsureFileDescriptors (bench_load.h). For the largest W: per worker this
// process holds its connection and its socket's mailbox (with --driver
// client also the pair of its handshake watch, and with
// --client-io-threads 0 a context's own), and the shard's process (forked
// from this one: the same limit) one connection. Past the soft limit,
// connections failed one by one as timeouts naming no cause.
Status EnsureFileDescriptors(const LoadArgs& args) {
  const uint64_t w_top = *std::max_element(args.workers.begin(), args.workers.end());
  const uint64_t per_worker = args.driver == Driver::kEvents ? 3
                              : args.client_io_threads > 0   ? 5
                                                             : 9;
  const uint64_t need = per_worker * w_top + 256;
  const FileLimit files = RaiseOpenFileLimit(need);
  if (files.hard == 0 || files.after >= need) return Status::OK();  // hard 0: not read
  return Status::InvalidArgument(
      "--workers " + std::to_string(w_top) + " needs about " + std::to_string(need) +
      " file descriptors (" + std::to_string(per_worker) +
      " a worker with this --driver and --client-io-threads, and 256 more) but the limit is " +
      std::to_string(files.after) + " (hard " + std::to_string(files.hard) +
      "); allowed: fewer workers, or a higher limit (ulimit -n)");
}

}  // namespace gridsync::bench::load
