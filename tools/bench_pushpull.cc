// gridsync-bench pushpull: push + pull throughput and latency of ONE PS shard
// on loopback against payload size, side by side with raw ZeroMQ moving the
// same bytes in the same message pattern, which is the practical limit.
//
// gridsync side: the real PsShard (async consistency, one worker, so every
// push is applied with Adam on arrival and pulls never wait) and the real
// PsClient. One table of width 2 (a hash-grid level). One iteration is
// Push(n rows) waiting for the ack, then SendPull + ReceivePull of the same
// n rows; the rows are every 3rd row of a region, like a batch's sparse,
// ascending touched rows.
//
// The pushes hand their buffers to the client (TableRowsRef::give_*), as
// the ps training loop does, so that the push's rows and values become its
// frames without a copy; the raw side sends its buffers without a copy too.
//
// Raw side: a DEALER client and a ROUTER echo thread in this process, each
// with a context (an I/O thread) of its own, as the shard and the client
// have: until 2026-12-02 they shared one, so one I/O thread carried both
// ends, which saved two thread wake-ups an iteration at small sizes and
// serialised both ends' socket copies at large ones. Per iteration
// [64 B header, ids, values] -> 64 B ack, then [64 B header, ids] ->
// [64 B header, values]: the same payload and round trips without decode,
// validation, apply and gather.
//
// Bytes counted per iteration, on both sides: 24 per row = push (4 B id +
// 8 B values) + pull (4 B id asked + 8 B values returned); message headers
// are not counted. GB/s = those bytes / median iteration time.
//
// CPU (the last table): each side's CPU per iteration, every thread of
// this process with the kernel's TCP work in their system calls, and the
// cores it kept busy, beside the rest of the host's. cpu_ceiling = zmq_p50
// x cores / gridsync_cpu bounds the ratio any overlap of gridsync's work
// could reach on this host: when it is below a target, the work itself
// must shrink, not only be spread over the cores.
//
// Memory floor (the table after it): the least memory work of an iteration
// for any design with fp32 Adam on the shard, run bare on this host's cores
// (bench_memory_floor.h); floor_ceiling = zmq_p50 / floor bounds the ratio
// of any design, however it overlaps and whatever it sends;
// floor_cpu_ceiling adds the sockets' CPU for the values to that work on
// the same cores (an estimate, charged by bytes).
//
// Correctness on every run (#wrong, must be 0): the table is initialised
// with known values, and every size gets a region of rows of its own that no
// other size touches. Before the timed iterations, one push of known
// gradients is pulled back together with the untouched neighbour rows: the
// pushed rows must equal a reference Adam step computed here from
// kernels/adam_math.h, and the neighbours their initial values. After the
// timed iterations the last pull must equal the reference after all
// 1 + warmup + iters pushes, so a dropped, duplicated or misplaced push is
// counted. The values, the reference and the counts: bench_pushpull_check.h.
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/cli_parse.h"
#include "common/cluster_map.h"
#include "common/config.h"
#include "common/message_heap.h"
#include "common/sharding.h"
#include "common/status.h"
#include "common/wire/message.h"
#include "kernels/adam_math.h"
#include "server/ps_shard.h"
#include "tools/bench.h"
#include "tools/bench_cpu.h"
#include "tools/bench_memory_floor.h"
#include "tools/bench_pushpull_check.h"
#include "tools/bench_raw_zmq.h"
#include "tools/bench_shard_map.h"
#include "worker/ps_client.h"

namespace gridsync::bench {
namespace {

using Clock = std::chrono::steady_clock;
using pushpull::CountWrongNeighbours;
using pushpull::CountWrongPushed;
using pushpull::Gradient;
using pushpull::InitialValue;
using pushpull::kStride;
using pushpull::kWidth;
using pushpull::Poison;
using pushpull::SizePlan;

constexpr uint64_t kPushBytesPerRow = sizeof(uint32_t) + kWidth * sizeof(float);
constexpr uint64_t kIterBytesPerRow = 2 * kPushBytesPerRow;  // push + pull
// The values' share of those bytes (pushed and pulled): what no row-id
// encoding can shrink.
constexpr double kValueShare = static_cast<double>(2 * kWidth * sizeof(float)) / kIterBytesPerRow;
// --iters 0 (auto): small sizes get many iterations so p99 means something,
// large ones few so the default sweep stays well under two minutes.
constexpr uint64_t kAutoItersBytes = uint64_t{256} << 20;
constexpr int kAutoItersMin = 20;
constexpr int kAutoItersMax = 1000;
constexpr auto kTimeout = std::chrono::seconds(60);

struct PushPullArgs {
  uint64_t min_bytes = uint64_t{4} << 10;
  uint64_t max_bytes = uint64_t{64} << 20;
  int iters = 0;  // 0: auto
  int warmup = 5;
  int shard_threads = ShardOptions{}.threads;
  uint64_t reply_part_bytes = ShardOptions{}.reply_part_bytes;
  // The process's heap as gridsync-ps and a ps or hybrid gridsync-worker
  // tune it (common/message_heap.h); --default-heap leaves glibc's
  // thresholds, to see what the tuning is worth.
  bool default_heap = false;
  std::string json_out;
};

struct Latency {
  double p50_us = 0;
  double p99_us = 0;
};

Latency Percentiles(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  // Nearest rank: p99 of fewer than 100 samples is the maximum.
  auto rank = [&](double p) {
    const size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(us.size())));
    return us[std::clamp<size_t>(k, 1, us.size()) - 1];
  };
  return {rank(0.50), rank(0.99)};
}

double MicrosSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

Status Pull(PsClient& client, const std::vector<uint32_t>& rows, std::vector<float>* table) {
  GRIDSYNC_RETURN_IF_ERROR(
      client.SendPull(0, {{0, false, rows.data(), rows.size(), table->data()}}));
  return client.ReceivePull().status();
}

// The timed loop on the gridsync side; returns each iteration's latency (us).
Result<std::vector<double>> TimeGridsync(PsClient& client, const std::vector<uint32_t>& rows,
                                         const std::vector<float>& grad, int warmup, int iters,
                                         uint64_t* step, std::vector<float>* table) {
  const std::vector<TablePullRef> pull = {{0, false, rows.data(), rows.size(), table->data()}};
  std::vector<double> us;
  us.reserve(static_cast<size_t>(iters));
  std::vector<uint32_t> push_rows;
  UninitVector<float> push_grad;
  for (int it = 0; it < warmup + iters; ++it) {
    // Untimed: the step's gradient in buffers of its own, which the client
    // takes as the push's frames (zero copy), as the ps training loop hands
    // over its touched rows (TableRowsRef::give_*).
    push_rows = rows;
    push_grad.assign(grad.begin(), grad.end());
    const std::vector<TableRowsRef> push = {{0, false, push_rows.data(), push_rows.size(),
                                             push_grad.data(), false, &push_rows, &push_grad}};
    const auto start = Clock::now();
    GRIDSYNC_RETURN_IF_ERROR(client.Push(wire::Kind::kPush, (*step)++, push));
    GRIDSYNC_RETURN_IF_ERROR(client.SendPull(0, pull));
    auto version = client.ReceivePull();
    if (!version.ok()) return version.status();
    if (it >= warmup) us.push_back(MicrosSince(start));
  }
  return us;
}

// Mean microseconds per gridsync iteration spent in each stage (warmup
// and timed iterations together): the client's request building and reply
// handling (PsCounters), the shard's serving stages (ServingStats::Stages),
// and what is left: the sockets, ZeroMQ's I/O threads and wake-ups.
struct StageMicros {
  double iteration = 0;
  double client_encode = 0, shard_decode = 0, apply = 0, gather = 0, shard_encode = 0, send = 0,
         client_decode = 0;
  double other() const {
    return iteration -
           (client_encode + shard_decode + apply + gather + shard_encode + send + client_decode);
  }
};

// CPU per iteration (mean us over warmup and timed iterations, every
// thread of this process: the client, the shard's, ZeroMQ's I/O threads and
// the kernel's TCP work they do in their system calls) and the cores that
// kept busy; `other` is the rest of the host's CPU over the same time.
struct CpuMicros {
  double self = 0, other = 0, wall = 0;
  double cores() const { return wall > 0 ? self / wall : 0; }
};

struct SizeResult {
  SizePlan plan;
  Latency gridsync;
  Latency zmq;
  StageMicros stages;
  CpuMicros gridsync_cpu, zmq_cpu;
  MemoryFloor floor;
  uint64_t wrong = 0;
};

// Measures fn's CPU and wall time per iteration into *out.
template <typename Fn>
auto WithCpu(int iterations, CpuMicros* out, Fn&& fn) {
  const CpuTimes before = ReadCpu();
  const auto start = Clock::now();
  auto result = fn();
  const double wall = MicrosSince(start);
  const CpuUse use = CpuBetween(before, ReadCpu());
  const double n = static_cast<double>(iterations);
  *out = {use.self_seconds * 1e6 / n, use.other_seconds * 1e6 / n, wall / n};
  return result;
}

// The ratio no schedule of gridsync's measured CPU work could beat on
// `cores`: its iteration cannot take less than cpu / cores.
double CpuCeiling(const SizeResult& r, int cores) {
  return r.gridsync_cpu.self > 0 ? r.zmq.p50_us * cores / r.gridsync_cpu.self : 0;
}

// The ratio no design with fp32 Adam on the shard reaches on this host:
// its iteration cannot take less than the memory floor (bench_memory_floor.h).
double FloorCeiling(const SizeResult& r) {
  return r.floor.total_us > 0 ? r.zmq.p50_us / r.floor.total_us : 0;
}

// The ratio no design reaches when the memory floor and the sockets share
// this host's `cores`: the floor's work (floor_total on every core) plus
// raw ZeroMQ's CPU for the values' share of its bytes (the row ids could
// shrink to nothing; the values cannot), overlapped perfectly. An
// estimate: it charges the sockets by bytes.
double FloorCpuCeiling(const SizeResult& r, int cores) {
  const double cpu = r.floor.total_us * cores + r.zmq_cpu.self * kValueShare;
  return cpu > 0 ? r.zmq.p50_us * cores / cpu : 0;
}

double GBps(const SizePlan& p, double us) {
  return static_cast<double>(p.n * kIterBytesPerRow) / (us * 1e-6) / 1e9;
}

int Fail(const Status& status) {
  std::fprintf(stderr, "gridsync-bench pushpull: %s\n", status.ToString().c_str());
  return 1;
}

int RunPushPull(const PushPullArgs& args) {
  if (!args.default_heap && !TuneHeapForMessages()) {
    std::fprintf(stderr, "gridsync-bench pushpull: the C library refused the heap thresholds\n");
    return 1;
  }
  if (args.min_bytes < kPushBytesPerRow || args.max_bytes < args.min_bytes) {
    return Fail(Status::InvalidArgument("--min-bytes " + std::to_string(args.min_bytes) +
                                        ", --max-bytes " + std::to_string(args.max_bytes) +
                                        "; allowed: " + std::to_string(kPushBytesPerRow) +
                                        " <= min <= max"));
  }

  // Sizes min, 4 min, ... <= max, each with a region of whole row blocks.
  std::vector<SizePlan> plans;
  uint64_t table_rows = 0;
  uint32_t max_n = 0;
  for (uint64_t bytes = args.min_bytes; bytes <= args.max_bytes; bytes *= 4) {
    SizePlan p;
    p.bytes = bytes;
    const uint64_t n = bytes / kPushBytesPerRow;
    if (n * kStride + table_rows > std::numeric_limits<uint32_t>::max()) {
      return Fail(Status::InvalidArgument("--max-bytes " + std::to_string(args.max_bytes) +
                                          " needs more than 2^32 table rows; allowed: smaller"));
    }
    p.n = static_cast<uint32_t>(n);
    p.base = static_cast<uint32_t>(table_rows);
    p.iters = args.iters > 0 ? args.iters
                             : static_cast<int>(std::clamp<uint64_t>(kAutoItersBytes / bytes,
                                                                     kAutoItersMin, kAutoItersMax));
    table_rows += (n * kStride + kRowBlock - 1) / kRowBlock * kRowBlock;
    max_n = std::max(max_n, p.n);
    plans.push_back(p);
  }

  const std::vector<TableInfo> tables = {{"level", table_rows, kWidth}};
  auto made = Partition::Make(tables, 1, ModelParallelDim::kRow);
  if (!made.ok()) return Fail(made.status());
  // The shard and the client keep references to it: it stays put from here.
  const Partition partition = std::move(made).value();

  ShardOptions options;
  options.endpoint = "tcp://127.0.0.1:0";
  options.workers = 1;
  options.consistency = Consistency::kAsync;
  options.threads = args.shard_threads;
  options.reply_part_bytes = args.reply_part_bytes;
  options.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(kTimeout);
  auto shard = PsShard::Start(partition, options);
  if (!shard.ok()) return Fail(shard.status());

  const ClusterMap map = OneShardMap((*shard)->endpoint(), tables, 1);
  auto client = PsClient::Connect(map, partition, 0, 1,
                                  std::chrono::duration_cast<std::chrono::milliseconds>(kTimeout));
  if (!client.ok()) return Fail(client.status());

  // Every row starts at its known value. The same buffer is then the pull
  // destination (the full table, as PsClient fills it).
  std::vector<float> table(table_rows * kWidth);
  for (uint64_t r = 0; r < table_rows; ++r) {
    for (uint32_t c = 0; c < kWidth; ++c) {
      table[r * kWidth + c] = InitialValue(static_cast<uint32_t>(r), c);
    }
  }
  if (auto s = (*client)->Push(wire::Kind::kInit, 0, {{0, true, nullptr, 0, table.data()}});
      !s.ok()) {
    return Fail(s.WithContext("init"));
  }

  auto raw = RawZmqPeer::Start(max_n, kWidth, kStride, kTimeout);
  if (!raw.ok()) return Fail(raw.status());

  int max_steps = 1;
  for (const auto& p : plans) max_steps = std::max(max_steps, 1 + args.warmup + p.iters);
  std::vector<float> step_size(static_cast<size_t>(max_steps) + 1, 0.0f);
  for (int t = 1; t <= max_steps; ++t) {
    step_size[static_cast<size_t>(t)] = AdamStepSize(options.hyper, static_cast<uint32_t>(t));
  }

  std::printf(
      "# gridsync-bench pushpull: 1 PS shard (async, Adam on arrival, %d threads, pull replies "
      "in parts of %llu bytes, 0 = whole; heap %s) and a raw "
      "ZeroMQ DEALER/ROUTER peer on tcp://127.0.0.1; table %llu rows x %u floats; one row in "
      "%u of a region per size; warmup %d; iters %s; bytes per iteration = %llu x rows (push "
      "ids + values, pull ids + values; headers not counted); GB/s = 1e9 B/s at the median; "
      "ratio = gridsync_GB/s / zmq_GB/s\n",
      options.threads, static_cast<unsigned long long>(options.reply_part_bytes),
      args.default_heap ? "glibc's defaults" : "tuned for messages as gridsync-ps and -worker",
      static_cast<unsigned long long>(table_rows), kWidth, kStride, args.warmup,
      args.iters > 0 ? std::to_string(args.iters).c_str() : "auto (256 MiB / size, 20..1000)",
      static_cast<unsigned long long>(kIterBytesPerRow));
  std::printf("#%9s %9s %6s %16s %16s %13s %16s %12s %12s %9s %6s %6s\n", "size(B)", "rows",
              "iters", "gridsync_p50(us)", "gridsync_p99(us)", "gridsync_GB/s", "gridsync_Mrows/s",
              "zmq_p50(us)", "zmq_p99(us)", "zmq_GB/s", "ratio", "#wrong");
  std::fflush(stdout);

  std::vector<SizeResult> results;
  uint64_t step = 0;  // the shard takes each worker's steps in order from 0
  uint64_t total_wrong = 0;
  for (const SizePlan& p : plans) {
    SizeResult result;
    result.plan = p;
    std::vector<uint32_t> rows(p.n);
    std::vector<uint32_t> with_neighbours;  // ascending: row, row + 1, ...
    with_neighbours.reserve(size_t{p.n} * 2);
    std::vector<float> grad(size_t{p.n} * kWidth);
    for (uint32_t i = 0; i < p.n; ++i) {
      rows[i] = p.base + kStride * i;
      with_neighbours.push_back(rows[i]);
      with_neighbours.push_back(rows[i] + 1);
      for (uint32_t c = 0; c < kWidth; ++c) grad[size_t{i} * kWidth + c] = Gradient(rows[i], c);
    }

    // Untimed: the first push to these fresh rows, pulled back with the
    // neighbours it must not have touched.
    if (auto s = (*client)->Push(wire::Kind::kPush, step++,
                                 {{0, false, rows.data(), rows.size(), grad.data()}});
        !s.ok()) {
      return Fail(s.WithContext("check push"));
    }
    Poison(with_neighbours, &table);
    if (auto s = Pull(**client, with_neighbours, &table); !s.ok()) {
      return Fail(s.WithContext("check pull"));
    }
    result.wrong += CountWrongPushed(p, table, options.hyper, step_size, 1);
    result.wrong += CountWrongNeighbours(p, table);

    Poison(rows, &table);
    const auto shard_before = (*shard)->serving_stats().stages;
    const PsCounters client_before = (*client)->counters();
    const int iterations = args.warmup + p.iters;
    auto ours = WithCpu(iterations, &result.gridsync_cpu, [&] {
      return TimeGridsync(**client, rows, grad, args.warmup, p.iters, &step, &table);
    });
    if (!ours.ok()) return Fail(ours.status());
    {
      const double n = static_cast<double>(iterations);
      const auto shard_after = (*shard)->serving_stats().stages;
      const PsCounters& client_after = (*client)->counters();
      auto per = [&](double after, double before) { return (after - before) * 1e6 / n; };
      StageMicros& st = result.stages;
      st.iteration = result.gridsync_cpu.wall;
      st.client_encode = per(client_after.encode_seconds, client_before.encode_seconds);
      st.client_decode = per(client_after.decode_seconds, client_before.decode_seconds);
      st.shard_decode = per(shard_after.decode, shard_before.decode);
      st.apply = per(shard_after.apply, shard_before.apply);
      st.gather = per(shard_after.gather, shard_before.gather);
      st.shard_encode = per(shard_after.encode, shard_before.encode);
      st.send = per(shard_after.send, shard_before.send);
    }
    auto theirs = WithCpu(iterations, &result.zmq_cpu,
                          [&] { return (*raw)->Time(p.n, args.warmup, p.iters); });
    if (!theirs.ok()) return Fail(theirs.status());
    result.wrong += CountWrongPushed(p, table, options.hyper, step_size, 1 + args.warmup + p.iters);
    result.floor = MeasureMemoryFloor(p.n, kStride, kWidth, UsableCores(), p.iters);

    result.gridsync = Percentiles(*ours);
    result.zmq = Percentiles(*theirs);
    const double ours_gbps = GBps(p, result.gridsync.p50_us);
    const double zmq_gbps = GBps(p, result.zmq.p50_us);
    std::printf("%10llu %9u %6d %16.1f %16.1f %13.3f %16.3f %12.1f %12.1f %9.3f %6.3f %6llu\n",
                static_cast<unsigned long long>(p.bytes), p.n, p.iters, result.gridsync.p50_us,
                result.gridsync.p99_us, ours_gbps, p.n / result.gridsync.p50_us, result.zmq.p50_us,
                result.zmq.p99_us, zmq_gbps, ours_gbps / zmq_gbps,
                static_cast<unsigned long long>(result.wrong));
    std::fflush(stdout);
    total_wrong += result.wrong;
    results.push_back(result);
  }
  std::printf(
      "# where a gridsync iteration's time goes (mean us per iteration): client_enc = worker Adam, "
      "split, codecs, wire encoding of push and pull; shard_dec = wire and codec decoding with "
      "validation; apply; gather; shard_enc = reply encoding; send = replies handed to ZeroMQ; "
      "client_dec = reply decoding and copies; other = sockets, I/O threads, wake-ups (the "
      "rest of the iteration: with pull replies in parts, gather, send and client_dec overlap "
      "the sockets and each other, so other can fall below 0)\n");
  std::printf("#%9s %10s %10s %10s %10s %10s %10s %10s %10s %10s\n", "size(B)", "iteration",
              "client_enc", "shard_dec", "apply", "gather", "shard_enc", "send", "client_dec",
              "other");
  for (const SizeResult& r : results) {
    const StageMicros& st = r.stages;
    std::printf("#%9llu %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f\n",
                static_cast<unsigned long long>(r.plan.bytes), st.iteration, st.client_encode,
                st.shard_decode, st.apply, st.gather, st.shard_encode, st.send, st.client_decode,
                st.other());
  }
  const int cores = UsableCores();
  std::printf(
      "# CPU per iteration (mean us, warmup included: this process's threads, user + system, "
      "so the kernel's TCP work in their calls too); cores = cpu / wall; other = the rest of "
      "the host's cores meanwhile; cpu_ceiling = zmq_p50 x %d cores / gridsync_cpu, the ratio "
      "no schedule of this work on this host's %d cores could beat\n",
      cores, cores);
  std::printf("#%9s %13s %14s %10s %13s %14s %10s %12s\n", "size(B)", "gridsync_cpu",
              "gridsync_cores", "other", "zmq_cpu", "zmq_cores", "other", "cpu_ceiling");
  for (const SizeResult& r : results) {
    std::printf("#%9llu %13.1f %14.2f %10.2f %13.1f %14.2f %10.2f %12.3f\n",
                static_cast<unsigned long long>(r.plan.bytes), r.gridsync_cpu.self,
                r.gridsync_cpu.cores(),
                r.gridsync_cpu.wall > 0 ? r.gridsync_cpu.other / r.gridsync_cpu.wall : 0,
                r.zmq_cpu.self, r.zmq_cpu.cores(),
                r.zmq_cpu.wall > 0 ? r.zmq_cpu.other / r.zmq_cpu.wall : 0, CpuCeiling(r, cores));
  }
  std::printf(
      "# memory floor (median us per iteration, %d threads, no sockets: bench_memory_floor.h): "
      "apply = gradients read, fp32 parameters and Adam moments read and written; gather = "
      "the pulled rows into the reply; scatter = the reply into the worker's table; beside "
      "them the same stages measured above (means); floor_ceiling = zmq_p50 / floor_total, the "
      "ratio no design with fp32 Adam state reaches on this host; floor_cpu_ceiling = zmq_p50 x "
      "%d cores / (floor_total x %d cores + zmq_cpu x %.3f), an estimate of the ratio no design "
      "reaches when that work and the sockets' share for the values (%.3f of the bytes) share "
      "these cores\n",
      cores, cores, cores, kValueShare, kValueShare);
  std::printf("#%9s %11s %11s %12s %12s %13s %11s %11s %13s %17s\n", "size(B)", "floor_apply",
              "shard_apply", "floor_gather", "shard_gather", "floor_scatter", "client_dec",
              "floor_total", "floor_ceiling", "floor_cpu_ceiling");
  for (const SizeResult& r : results) {
    std::printf("#%9llu %11.1f %11.1f %12.1f %12.1f %13.1f %11.1f %11.1f %13.3f %17.3f\n",
                static_cast<unsigned long long>(r.plan.bytes), r.floor.apply_us, r.stages.apply,
                r.floor.gather_us, r.stages.gather, r.floor.scatter_us, r.stages.client_decode,
                r.floor.total_us, FloorCeiling(r), FloorCpuCeiling(r, cores));
  }
  std::printf("# #wrong total: %llu%s\n", static_cast<unsigned long long>(total_wrong),
              total_wrong == 0 ? "" : " (FAILED: pulled values differ from the reference)");

  if (!args.json_out.empty()) {
    nlohmann::json out;
    out["settings"] = {{"shards", 1},
                       {"consistency", "async"},
                       {"shard_threads", options.threads},
                       {"reply_part_bytes", options.reply_part_bytes},
                       {"heap", args.default_heap ? "default" : "tuned"},
                       {"table_rows", table_rows},
                       {"width", kWidth},
                       {"row_stride", kStride},
                       {"warmup", args.warmup},
                       {"iters", args.iters},
                       {"bytes_per_iteration_per_row", kIterBytesPerRow}};
    out["rows"] = nlohmann::json::array();
    for (const auto& r : results) {
      const double ours_gbps = GBps(r.plan, r.gridsync.p50_us);
      const double zmq_gbps = GBps(r.plan, r.zmq.p50_us);
      out["rows"].push_back({{"size_bytes", r.plan.bytes},
                             {"rows", r.plan.n},
                             {"iters", r.plan.iters},
                             {"gridsync_p50_us", r.gridsync.p50_us},
                             {"gridsync_p99_us", r.gridsync.p99_us},
                             {"gridsync_gbps", ours_gbps},
                             {"gridsync_mrows_per_s", r.plan.n / r.gridsync.p50_us},
                             {"zmq_p50_us", r.zmq.p50_us},
                             {"zmq_p99_us", r.zmq.p99_us},
                             {"zmq_gbps", zmq_gbps},
                             {"ratio", ours_gbps / zmq_gbps},
                             {"gridsync_cpu_us", r.gridsync_cpu.self},
                             {"gridsync_cores", r.gridsync_cpu.cores()},
                             {"zmq_cpu_us", r.zmq_cpu.self},
                             {"zmq_cores", r.zmq_cpu.cores()},
                             {"cpu_ceiling", CpuCeiling(r, UsableCores())},
                             {"memory_floor_us", r.floor.total_us},
                             {"floor_ceiling", FloorCeiling(r)},
                             {"floor_cpu_ceiling", FloorCpuCeiling(r, UsableCores())},
                             {"wrong", r.wrong}});
    }
    std::ofstream file(args.json_out);
    file << out.dump(2) << "\n";
    if (!file) return Fail(Status::IOError("cannot write " + args.json_out));
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

Runner AddPushPullCommand(CLI::App* app) {
  auto args = std::make_shared<PushPullArgs>();
  auto* cmd = app->add_subcommand(
      "pushpull", "Push+pull throughput and latency of one PS shard on loopback vs raw ZeroMQ");
  // Sizes accept units (4KB, 64MB; KB = 1024 B).
  cmd->add_option("--min-bytes", args->min_bytes, "Smallest push payload (bytes; sweep x4)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--max-bytes", args->max_bytes, "Largest push payload (bytes)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--iters", args->iters,
                  "Timed iterations per size (0: auto, 256 MiB / size clamped to 20..1000)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--warmup", args->warmup, "Untimed iterations per size")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--shard-threads", args->shard_threads,
                  "The shard's threads for apply and gather (ps.threads)")
      ->check(CLI::Range(1, 64));
  cmd->add_flag("--default-heap", args->default_heap,
                "Leave glibc's heap thresholds as they are (gridsync-ps and a ps or hybrid "
                "gridsync-worker tune them for messages: common/message_heap.h)");
  cmd->add_option("--reply-part-bytes", args->reply_part_bytes,
                  "Pull replies go in parts of about this many bytes (0: whole)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--json", args->json_out, "Write the results as JSON to this file")
      ->check(OutputFile());
  return [args] { return RunPushPull(*args); };
}

}  // namespace gridsync::bench
