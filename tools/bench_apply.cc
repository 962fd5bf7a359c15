// gridsync-bench apply: one PS shard's apply of a bsp step's pushes, as the
// shard runs it (ShardStore::ApplyPushes: one push straight from its values,
// up to kMaxMergedPushes merged per table, more summed then stepped), with Adam on the
// shard and with the workers' updates (ps.optimizer = worker), for 1, 2, 4,
// 8 and 16 pushes a step. No sockets and no decoding: the apply alone, the
// stage a step's pushes wait on, which pushpull (one client) and load
// (async: one push a step) never run merged.
//
// Each push lists `rows` distinct rows of every table, drawn at random from
// the rows shard 0 of 2 owns, ascending, as a hash-grid batch's are; a few
// sets of batches are made before the run and the steps cycle through them.
// #wrong counts steps whose store, after the run, differs by a bit from a
// second store that applied the same pushes on this thread alone (the pool
// must change nothing).
//
// Thread safety: main thread only; the pool's threads are its own.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/sharding.h"
#include "common/thread_pool.h"
#include "common/wire/message.h"
#include "server/shard_store.h"
#include "tools/bench.h"
#include "tools/bench_stats.h"

namespace gridsync::bench {
namespace {

struct ApplyArgs {
  std::vector<uint32_t> pushes = {1, 2, 4, 8, 16};
  uint32_t tables = 16;
  uint32_t table_rows = 1u << 19;
  uint32_t width = 2;
  uint32_t rows = 16384;
  int steps = 30;
  int threads = 1;
  uint64_t seed = 1;
};

constexpr int kBatchSets = 4;  // the steps cycle through this many sets of pushes
constexpr int kWarmupSteps = 2;

// One step's pushes: per push, a message listing every table once.
struct StepPushes {
  std::vector<std::vector<std::vector<uint32_t>>> rows;  // [push][table]
  std::vector<std::vector<std::vector<float>>> values;   // [push][table]
  std::vector<wire::Message> messages;
  std::vector<const wire::Message*> pointers;
};

std::unique_ptr<StepPushes> MakeStep(const Partition& partition, const ApplyArgs& args,
                                     uint32_t pushes, std::mt19937_64* random) {
  auto step = std::make_unique<StepPushes>();
  step->rows.resize(pushes);
  step->values.resize(pushes);
  step->messages.resize(pushes);
  std::uniform_real_distribution<float> value(-1e-3f, 1e-3f);
  for (uint32_t p = 0; p < pushes; ++p) {
    wire::Message& m = step->messages[p];
    m.kind = wire::Kind::kPush;
    m.worker_rank = p;
    for (uint32_t t = 0; t < args.tables; ++t) {
      // Distinct owned rows: a bitmap over the table, then its set bits.
      std::vector<bool> taken(args.table_rows, false);
      std::vector<uint32_t> rows;
      while (rows.size() < args.rows) {
        const auto row = static_cast<uint32_t>((*random)() % args.table_rows);
        if (taken[row] || partition.Owner(t, row, 0) != 0) continue;
        taken[row] = true;
        rows.push_back(row);
      }
      std::sort(rows.begin(), rows.end());
      std::vector<float> values(rows.size() * args.width);
      for (float& v : values) v = value(*random);
      step->rows[p].push_back(std::move(rows));
      step->values[p].push_back(std::move(values));
    }
  }
  for (uint32_t p = 0; p < pushes; ++p) {
    for (uint32_t t = 0; t < args.tables; ++t) {
      wire::Block block;
      block.table = t;
      block.width = args.width;
      block.row_count = static_cast<uint32_t>(step->rows[p][t].size());
      block.rows = step->rows[p][t];
      block.values = step->values[p][t];
      step->messages[p].blocks.push_back(block);
    }
    step->pointers.push_back(&step->messages[p]);
  }
  return step;
}

int RunApply(const ApplyArgs& args) {
  // Shard 0 owns about half a table's rows; a push draws its rows among them.
  if (args.rows > args.table_rows / 4) {
    std::fprintf(stderr,
                 "gridsync-bench apply: --rows %u is more than a quarter of a table's %u rows "
                 "(shard 0 owns half of them); allowed: 1..%u\n",
                 args.rows, args.table_rows, args.table_rows / 4);
    return 2;
  }
  std::vector<TableInfo> tables;
  for (uint32_t t = 0; t < args.tables; ++t)
    tables.push_back({"level" + std::to_string(t), args.table_rows, args.width});
  auto partition = Partition::Make(tables, 2, ModelParallelDim::kRow);
  if (!partition.ok()) {
    std::fprintf(stderr, "gridsync-bench apply: %s\n", partition.status().ToString().c_str());
    return 2;
  }
  ThreadPool pool(args.threads);
  std::printf(
      "# gridsync-bench apply: shard 0 of 2, %u tables of %u rows x %u floats, %u rows a push a "
      "table (random, ascending), %d timed steps after %d, %d pool thread(s)\n",
      args.tables, args.table_rows, args.width, args.rows, args.steps, kWarmupSteps, args.threads);
  std::printf(
      "# ms: median (p90) of a step's ShardStore::ApplyPushes; Mrows/s = pushed rows (pushes x "
      "tables x rows) / median; ns/row = its inverse; path: direct (1 push), merged (<= %zu), "
      "summed; #wrong: the store differs by a bit from one that applied the same steps on one "
      "thread\n",
      ShardStore::kMaxMergedPushes);
  std::printf("# %-8s %6s %8s %10s %10s %9s %8s %7s\n", "optimizer", "pushes", "path", "ms",
              "(p90)", "Mrows/s", "ns/row", "#wrong");
  int wrong_total = 0;
  for (bool updates : {false, true}) {
    for (uint32_t pushes : args.pushes) {
      std::mt19937_64 random(args.seed + pushes);
      std::vector<std::unique_ptr<StepPushes>> sets;
      for (int s = 0; s < kBatchSets; ++s)
        sets.push_back(MakeStep(*partition, args, pushes, &random));
      AdamHyper hyper;
      ShardStore store(*partition, 0, hyper, updates);
      ShardStore reference(*partition, 0, hyper, updates);
      std::vector<double> ms;
      for (int s = 0; s < kWarmupSteps + args.steps; ++s) {
        const auto& step = sets[static_cast<size_t>(s) % sets.size()]->pointers;
        const auto start = std::chrono::steady_clock::now();
        store.ApplyPushes(step, &pool);
        const auto end = std::chrono::steady_clock::now();
        if (s >= kWarmupSteps)
          ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
        reference.ApplyPushes(step, nullptr);
      }
      std::string got, want;
      store.AppendState(&got);
      reference.AppendState(&want);
      const int wrong = got == want ? 0 : 1;
      wrong_total += wrong;
      std::sort(ms.begin(), ms.end());
      const double median = Median(ms);
      const double p90 = ms[std::min(ms.size() - 1, ms.size() * 9 / 10)];
      const double rows = static_cast<double>(pushes) * args.tables * args.rows;
      const char* path = pushes == 1                              ? "direct"
                         : pushes <= ShardStore::kMaxMergedPushes ? "merged"
                                                                  : "summed";
      std::printf("  %-8s %6u %8s %10.3f %10.3f %9.1f %8.2f %7d\n", updates ? "updates" : "adam",
                  pushes, path, median, p90, rows / median / 1e3, median * 1e6 / rows, wrong);
      std::fflush(stdout);
    }
  }
  std::printf("# #wrong total: %d\n", wrong_total);
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace

Runner AddApplyCommand(CLI::App* app) {
  auto args = std::make_shared<ApplyArgs>();
  auto* cmd = app->add_subcommand(
      "apply", "One PS shard's apply of a bsp step's pushes (1 to 16 a step), Adam and updates");
  cmd->add_option("--pushes", args->pushes, "Pushes a step to run (e.g. 1,2,4,8,16)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tables", args->tables, "Tables (hash-grid levels)")->check(CLI::Range(1, 64));
  cmd->add_option("--table-rows", args->table_rows, "Rows of each table")
      ->check(CLI::Range(4096u, 1u << 24));
  cmd->add_option("--width", args->width, "Floats a row")->check(CLI::Range(1, 64));
  cmd->add_option("--rows", args->rows, "Rows a push lists of each table")
      ->check(CLI::Range(1u, 1u << 22));
  cmd->add_option("--steps", args->steps, "Timed steps")->check(CLI::Range(1, 100000));
  cmd->add_option("--threads", args->threads, "The shard's pool threads (ps.threads)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--seed", args->seed, "Seed of the rows and values");
  return [args] { return RunApply(*args); };
}

}  // namespace gridsync::bench
