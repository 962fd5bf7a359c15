// gridsync-bench compress --train (bench_compress.h): a ps-mode cluster in
// this process per codec, trained and compared with the uncompressed run.
//
// Thread safety: one thread (the cluster's workers run on their own).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cluster_map.h"
#include "common/config.h"
#include "common/coordinator_client.h"
#include "common/counter_rng.h"
#include "common/file_limit.h"
#include "common/message_heap.h"
#include "common/sharding.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "common/wire/message.h"
#include "kernels/cpu/codec.h"
#include "server/coordinator.h"
#include "server/in_process_cluster.h"
#include "server/ps_shard.h"
#include "spec/run_spec.h"
#include "tools/bench.h"
#include "tools/bench_compress.h"
#include "tools/bench_cpu.h"
#include "worker/image_task.h"
#include "worker/model.h"
#include "worker/params_file.h"
#include "worker/sync/ps_session.h"
#include "worker/sync/step_observer.h"
#include "worker/sync/train.h"

namespace gridsync::bench::compress {
namespace {

// ---------------------------------------------------------------------------
// --train.

// Rank 0's steps, summed: where a codec's extra time goes (the model's
// compute, the push, the wait for the pull).
class PhaseSums : public StepObserver {
 public:
  void OnStep(const StepRecord& r) override {
    prepare += r.prepare_seconds;
    compute += r.compute_seconds;
    apply += r.apply_seconds;
    push += r.sync.push_seconds;
    pull_wait += r.sync.pull_wait_seconds;
  }
  double prepare = 0, compute = 0, apply = 0, push = 0, pull_wait = 0;
};

struct TrainRun {
  PhaseSums phases;  // rank 0's
  std::vector<Result<TrainReport>> reports;
  std::vector<uint64_t> applied_steps;  // per shard
  double wall_seconds = 0;              // cluster start to stop
  double cpu_seconds = 0;               // this process's threads over the same time (user + system)
};

// One codec's run: a fresh cluster, the workers as threads.
Result<TrainRun> RunCluster(const Config& config, const ImageTask& image) {
  const auto start = Clock::now();
  const double cpu_start = SelfCpuSeconds();
  GRIDSYNC_ASSIGN_OR_RETURN(std::unique_ptr<InProcessCluster> cluster,
                            InProcessCluster::Start(config));
  TrainRun run;
  const int workers = config.distributed.world_size;
  run.reports.assign(workers, Status::Internal("not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      WorkerOptions options;
      options.rank = w;
      options.train.quiet = true;
      options.train.write_png = false;
      if (w == 0) options.train.observers.push_back(&run.phases);
      run.reports[w] = TrainWorker(cluster->config(), image, options);
    });
  }
  for (auto& t : threads) t.join();
  run.applied_steps = cluster->AppliedSteps();
  cluster->Stop();
  run.wall_seconds = Seconds(start, Clock::now());
  run.cpu_seconds = SelfCpuSeconds() - cpu_start;
  return run;
}

// One codec's run, as its row needs it.
struct CodecRound {
  size_t seed = 0;  // index into the sweep's seeds
  bool started = false;
  uint64_t wrong = 0;
  double psnr = NAN;
  double push = NAN, pull = NAN;  // per worker and step (mean over workers)
  double train_s = NAN, comm_s = NAN, adam_s = NAN, codec_s = NAN;
  double wall_s = NAN, cpu_s = NAN;
  PhaseSums phases;
};

CodecRound RunRound(const std::string& codec, const Config& config, const ImageTask& image,
                    int steps) {
  CodecRound round;
  auto run = RunCluster(config, image);
  if (!run.ok()) {
    std::fprintf(stderr, "%s: the cluster failed to start: %s\n", codec.c_str(),
                 run.status().ToString().c_str());
    return round;
  }
  round.started = true;
  round.wall_s = run->wall_seconds;
  round.cpu_s = run->cpu_seconds;
  round.phases = run->phases;
  double push = 0, pull = 0;
  int ok_workers = 0;
  for (const auto& r : run->reports) {
    if (!r.ok()) {
      std::fprintf(stderr, "%s: a worker failed: %s\n", codec.c_str(),
                   r.status().ToString().c_str());
      ++round.wrong;
      continue;
    }
    push += r->bytes_pushed_per_step;
    pull += r->bytes_pulled_per_step;
    ++ok_workers;
  }
  if (ok_workers > 0) {
    round.push = push / ok_workers;
    round.pull = pull / ok_workers;
  }
  const bool have0 = run->reports[0].ok();
  // Plus the flush of error feedback's residuals after the last step.
  const uint64_t expected_steps =
      static_cast<uint64_t>(steps) + (have0 && run->reports[0]->flushed_residuals ? 1 : 0);
  for (uint64_t applied : run->applied_steps) round.wrong += applied != expected_steps;
  if (have0) {
    const TrainReport& r0 = *run->reports[0];
    round.psnr = r0.psnr;
    round.train_s = r0.train_seconds;
    round.comm_s = r0.comm_seconds;
    round.adam_s = r0.worker_adam_seconds;
    round.codec_s = r0.codec_seconds;
  }
  round.wrong += !std::isfinite(round.psnr);
  return round;
}

// A codec's row: medians over its rounds that ran; train_x pairs each
// round with none's of the same round.
struct CodecRow {
  int failures = 0;
  uint64_t wrong = 0;
  double psnr = NAN, push = NAN, pull = NAN;
  double train_s = NAN, train_x = NAN, comm_s = NAN, adam_s = NAN, codec_s = NAN, wall_s = NAN;
  // The whole run's CPU (RunCluster: workers, shards, ZeroMQ), its cores
  // (cpu_s / wall_s), cpu_x = cpu_s / none's, wall_x = wall_s / none's, and
  // wall_floor_x = cpu_s / (cores x none's wall_s): the least wall_x any
  // schedule of this run's CPU on the cores could reach. Above 1, a run as
  // fast as none's needs less CPU, not more parallelism.
  double cpu_s = NAN, run_cores = NAN, cpu_x = NAN, wall_x = NAN, wall_floor_x = NAN;
  PhaseSums phases;  // each the median over rounds
  // Per seed (the first round's; later ones must repeat it): psnr, push
  // and pull above are their means.
  std::vector<double> seed_psnr, seed_push, seed_pull;
};

// `none`: none's rounds, each compared with the same round of this codec
// (a round that did not start has NaN figures, which leave no ratio).
CodecRow Summarize(const std::vector<CodecRound>& rounds, const std::vector<CodecRound>& none,
                   int cores, size_t seeds) {
  CodecRow row;
  row.seed_psnr.assign(seeds, NAN);
  row.seed_push.assign(seeds, NAN);
  row.seed_pull.assign(seeds, NAN);
  std::vector<double> train, ratio, comm, adam, codec, wall, cpu, run_cores, cpu_x, wall_x, floor_x;
  std::vector<double> prepare, compute, apply, push, pull_wait;
  const auto add = [](std::vector<double>* to, double v) {
    if (std::isfinite(v)) to->push_back(v);
  };
  const auto median = [](const std::vector<double>& v) { return v.empty() ? NAN : Median(v); };
  for (size_t r = 0; r < rounds.size(); ++r) {
    const CodecRound& round = rounds[r];
    if (!round.started) {
      ++row.failures;
      continue;
    }
    row.wrong += round.wrong;
    add(&train, round.train_s);
    if (r < none.size()) {
      add(&ratio, round.train_s / none[r].train_s);
      add(&wall_x, round.wall_s / none[r].wall_s);
    }
    // A CPU reading of 0 is a failed getrusage, not a free run.
    if (round.cpu_s > 0) {
      add(&cpu, round.cpu_s);
      add(&run_cores, round.cpu_s / round.wall_s);
      if (r < none.size() && none[r].cpu_s > 0) {
        add(&cpu_x, round.cpu_s / none[r].cpu_s);
        add(&floor_x, round.cpu_s / (cores * none[r].wall_s));
      }
    }
    add(&comm, round.comm_s);
    add(&adam, round.adam_s);
    add(&codec, round.codec_s);
    add(&wall, round.wall_s);
    add(&prepare, round.phases.prepare);
    add(&compute, round.phases.compute);
    add(&apply, round.phases.apply);
    add(&push, round.phases.push);
    add(&pull_wait, round.phases.pull_wait);
    // bsp with the same seeds trains the same bits every time: a PSNR or a
    // byte count that moves between rounds is a defect, not noise.
    double& psnr = row.seed_psnr[round.seed];
    double& push_b = row.seed_push[round.seed];
    double& pull_b = row.seed_pull[round.seed];
    if (std::isnan(psnr)) {
      psnr = round.psnr;
      push_b = round.push;
      pull_b = round.pull;
    } else if (round.psnr != psnr || round.push != push_b || round.pull != pull_b) {
      std::fprintf(stderr,
                   "run %zu (seed %zu): PSNR %.6f dB, %.0f / %.0f bytes pushed / pulled a step; "
                   "its first round had %.6f dB, %.0f / %.0f\n",
                   r + 1, round.seed + 1, round.psnr, round.push, round.pull, psnr, push_b, pull_b);
      ++row.wrong;
    }
  }
  row.psnr = MeanOfFinite(row.seed_psnr);
  row.push = MeanOfFinite(row.seed_push);
  row.pull = MeanOfFinite(row.seed_pull);
  row.train_s = median(train);
  row.train_x = median(ratio);
  row.comm_s = median(comm);
  row.adam_s = median(adam);
  row.codec_s = median(codec);
  row.wall_s = median(wall);
  row.cpu_s = median(cpu);
  row.run_cores = median(run_cores);
  row.cpu_x = median(cpu_x);
  row.wall_x = median(wall_x);
  row.wall_floor_x = median(floor_x);
  row.phases.prepare = median(prepare);
  row.phases.compute = median(compute);
  row.phases.apply = median(apply);
  row.phases.push = median(push);
  row.phases.pull_wait = median(pull_wait);
  return row;
}

}  // namespace

namespace {

// Per worker and shard: the worker's DEALER and its mailbox, the pair of
// its handshake watch, and the shard's end of the connection; per process
// (worker or shard) a context's I/O thread, poller and sockets of its own;
// 128 for the rest (the coordinator, logs, libraries). Measured: 593 at
// its peak for 4 workers x 16 shards, where this says 672.
Status EnsureFileDescriptors(const CompressArgs& args) {
  const uint64_t pairs = uint64_t(args.workers) * uint64_t(args.shards);
  const uint64_t need = 6 * pairs + 8 * uint64_t(args.workers + args.shards) + 128;
  const FileLimit files = RaiseOpenFileLimit(need);
  if (files.hard == 0 || files.after >= need) return Status::OK();  // hard 0: not read
  return Status::InvalidArgument(
      "--workers " + std::to_string(args.workers) + " x --shards " + std::to_string(args.shards) +
      " need about " + std::to_string(need) + " file descriptors in this process (6 a worker " +
      "and shard pair, 8 a process, 128 more) but the limit is " + std::to_string(files.after) +
      " (hard " + std::to_string(files.hard) +
      "); allowed: fewer workers or shards, or a higher limit (ulimit -n)");
}

}  // namespace

int RunTrainSweep(const CompressArgs& args) {
  const int batch = args.batch > 0 ? args.batch : kTrainDefaultBatch;
  std::vector<std::string> codecs = ListedCodecs(args);
  // none first: every other row's PSNR difference is against it.
  std::stable_partition(codecs.begin(), codecs.end(), [](const auto& c) { return c == "none"; });
  for (size_t i = 1; i < codecs.size(); ++i) {
    if (std::find(codecs.begin(), codecs.begin() + static_cast<std::ptrdiff_t>(i), codecs[i]) ==
        codecs.begin() + static_cast<std::ptrdiff_t>(i))
      continue;
    // Two rows of one codec made a plot with no valid points (a probe).
    std::fprintf(stderr, "--codecs: %s is named twice; allowed: each codec once\n",
                 codecs[i].c_str());
    return kConfigErrorExitCode;
  }
  // Every worker of every cluster here holds a socket to every shard: past
  // the open-files limit ZeroMQ threw from a worker's thread, or asserted
  // inside, and the process aborted (a probe at ulimit -n 1024 with 32 x 32).
  if (const Status files = EnsureFileDescriptors(args); !files.ok()) {
    std::fprintf(stderr, "%s\n", files.message().c_str());
    return kConfigErrorExitCode;
  }
  std::vector<Config> configs;
  for (const auto& entry : codecs) {
    const CodecEntry parsed = ParseCodecEntry(entry);
    std::vector<std::string> sets = {"distributed.enable=true",
                                     "distributed.gradient_sync=ps",
                                     "ps.consistency=bsp",
                                     "distributed.world_size=" + std::to_string(args.workers),
                                     "ps.shards=" + std::to_string(args.shards),
                                     "training.steps=" + std::to_string(args.steps),
                                     "training.batch_size=" + std::to_string(batch),
                                     "training.threads=" + std::to_string(args.threads),
                                     "training.log_every=0",
                                     "compression.codec=" + parsed.codec};
    if (!parsed.error_feedback.empty())
      sets.push_back("compression.error_feedback=" + parsed.error_feedback);
    auto config = LoadConfig(args, sets);
    Status status = config.ok() ? config->CheckRunnable(false) : config.status();
    if (status.ok()) status = CodecFromConfig(config->compression).status();
    if (!status.ok()) {
      std::fprintf(stderr, "%s\n", status.message().c_str());
      return kConfigErrorExitCode;
    }
    configs.push_back(*config);
  }
  auto image = ImageTask::Load(configs.front().task.image);
  if (!image.ok()) {
    std::fprintf(stderr, "%s\n", image.status().message().c_str());
    return kConfigErrorExitCode;
  }
  const Config& c0 = configs.front();
  const std::vector<uint64_t> seeds =
      args.seeds.empty() ? std::vector<uint64_t>{c0.training.seed} : args.seeds;
  for (size_t s = 0; s < seeds.size(); ++s) {
    if (std::find(seeds.begin(), seeds.begin() + s, seeds[s]) == seeds.begin() + s) continue;
    std::fprintf(stderr, "--seeds: %llu listed twice; allowed: distinct seeds\n",
                 static_cast<unsigned long long>(seeds[s]));
    return kConfigErrorExitCode;
  }
  // The shards and workers exchange messages of megabytes, as gridsync-ps
  // and a ps worker do, so the heap is tuned as theirs is
  // (common/message_heap.h): the runs then compare what a deployment runs.
  if (!TuneHeapForMessages()) {
    std::fprintf(stderr,
                 "gridsync-bench compress --train: the C library refused the heap "
                 "thresholds\n");
    return 1;
  }
  // The coordinator warns whenever a member leaves, and every run here ends
  // with all of them leaving; failures still reach stderr, as a worker's or
  // the cluster's Status below, and as errors.
  spdlog::set_level(spdlog::level::err);
  std::printf(
      "# gridsync-bench compress --train: ps-mode clusters in this process, one per codec\n");
  std::printf("%s\n", ModelLine(c0, *image).c_str());
  std::printf(
      "# %d steps, global batch %d, %d workers x %d threads, %d shards x %d threads, bsp; "
      "min_bytes %d; %s; heap tuned for messages as gridsync-ps and -worker\n",
      c0.training.steps, c0.training.batch_size, c0.distributed.world_size, c0.training.threads,
      c0.ps.shards, c0.ps.threads, args.min_bytes, CodecSettings(c0.compression).c_str());
  std::printf(
      "# psnr: rank 0 after the last step; push/pull_B/step: per worker (mean), whole "
      "messages of the training steps (the one-off initial push is not counted); "
      "push_ratio = none's push_B / this push_B (the flush of error feedback's residuals after "
      "the last step included); ef: error feedback; adam: where Adam ran (ps.optimizer); train_s, "
      "comm_s: rank 0; of those, adam_s: worker Adam, codec_s: codecs with error feedback "
      "(both in comm_s); train_x: train_s / none's train_s of the same round; %d round%s: "
      "every column the median over rounds, the codecs in turn (every other round in reverse "
      "order); a PSNR or byte count that differs between rounds counts in #wrong\n",
      args.rounds, args.rounds == 1 ? "" : "s");
  if (seeds.size() > 1) {
    std::string list;
    for (uint64_t seed : seeds) list += (list.empty() ? "" : ",") + std::to_string(seed);
    std::printf(
        "# %zu training seeds (%s), every codec under each in every round: psnr_dB, push_B and "
        "pull_B are means over seeds; dpsnr_dB the mean of each seed's difference from none, "
        "dpsnr_lo and dpsnr_hi the least and greatest of them; the timing columns medians over "
        "every run\n",
        seeds.size(), list.c_str());
  }
  std::vector<Column> columns = {{"codec", 8}, {"ef", 3},      {"adam", 6},
                                 {"steps", 6}, {"psnr_dB", 8}, {"dpsnr_dB", 8}};
  if (seeds.size() > 1) columns.insert(columns.end(), {{"dpsnr_lo", 8}, {"dpsnr_hi", 8}});
  columns.insert(columns.end(), {{"push_B/step", 12},
                                 {"pull_B/step", 12},
                                 {"push_ratio", 10},
                                 {"train_s", 8},
                                 {"train_x", 8},
                                 {"comm_s", 8},
                                 {"adam_s", 7},
                                 {"codec_s", 8},
                                 {"wall_s", 8},
                                 {"#wrong", 7}});
  Table table(std::move(columns));
  table.PrintHeader();
  // Every round runs each codec once: forward, then in reverse, so that a
  // codec's place in the process (a warm heap, a host that slows down)
  // does not side with one codec; the rounds' medians make the row.
  // Every codec's list holds its runs in the same (round, seed) order, so
  // the same place in two lists is the same round and seed.
  std::vector<std::vector<CodecRound>> rounds(codecs.size());
  for (int r = 0; r < args.rounds; ++r) {
    for (size_t s = 0; s < seeds.size(); ++s) {
      for (size_t k = 0; k < configs.size(); ++k) {
        const size_t i = r % 2 == 0 ? k : configs.size() - 1 - k;
        std::fprintf(stderr, "round %d of %d, seed %llu: training %s, %d steps...\n", r + 1,
                     args.rounds, static_cast<unsigned long long>(seeds[s]), codecs[i].c_str(),
                     args.steps);
        Config config = configs[i];
        config.training.seed = seeds[s];
        CodecRound round = RunRound(codecs[i], config, *image, args.steps);
        round.seed = s;
        rounds[i].push_back(round);
      }
    }
  }
  uint64_t total_wrong = 0;
  int failures = 0;
  const int cores = UsableCores();
  std::vector<CodecRow> rows;
  for (const auto& codec_rounds : rounds)
    rows.push_back(Summarize(codec_rounds, rounds.front(), cores, seeds.size()));
  const CodecRow& none_row = rows.front();  // none runs first (see above)
  const bool none_ok = none_row.wrong == 0 && none_row.failures == 0;
  const double none_push = none_ok ? none_row.push : NAN;
  for (size_t i = 0; i < configs.size(); ++i) {
    const std::string& codec = codecs[i];
    const CodecRow& row = rows[i];
    failures += row.failures;
    total_wrong += row.wrong;
    const auto num = [](const char* f, double v) { return std::isfinite(v) ? Fmt(f, v) : "-"; };
    // Each seed's difference from none's run under the same seed.
    std::vector<double> deltas;
    for (size_t s = 0; s < seeds.size() && none_ok; ++s) {
      const double d = row.seed_psnr[s] - none_row.seed_psnr[s];
      if (std::isfinite(d)) deltas.push_back(d);
    }
    std::vector<std::string> cells = {codec,
                                      codec == "none"                         ? "-"
                                      : configs[i].compression.error_feedback ? "on"
                                                                              : "off",
                                      configs[i].OptimizerOnWorkers() ? "worker" : "shard",
                                      std::to_string(args.steps),
                                      num("%.2f", row.psnr),
                                      num("%+.2f", MeanOfFinite(deltas))};
    if (seeds.size() > 1) {
      const bool any = !deltas.empty();
      cells.push_back(num("%+.2f", any ? *std::min_element(deltas.begin(), deltas.end()) : NAN));
      cells.push_back(num("%+.2f", any ? *std::max_element(deltas.begin(), deltas.end()) : NAN));
    }
    cells.insert(cells.end(),
                 {num("%.0f", row.push), num("%.0f", row.pull), num("%.2f", none_push / row.push),
                  num("%.1f", row.train_s), num("%.2f", row.train_x), num("%.1f", row.comm_s),
                  num("%.2f", row.adam_s), num("%.2f", row.codec_s), num("%.1f", row.wall_s),
                  std::to_string(row.wrong)});
    table.AddRow(std::move(cells));
  }
  if (seeds.size() > 1) {
    std::printf("# psnr_dB per seed:");
    for (uint64_t seed : seeds) std::printf(" %llu", static_cast<unsigned long long>(seed));
    std::printf("\n");
    for (size_t i = 0; i < configs.size(); ++i) {
      std::printf("#   %-8s", codecs[i].c_str());
      for (double psnr : rows[i].seed_psnr) std::printf(" %.4f", psnr);
      std::printf("\n");
    }
  }
  // Where the steps' time went (rank 0's steps summed, medians over rounds):
  // prepare samples the batch and waits for its pull, compute is forward
  // and backward, apply pushes (worker Adam and codecs included).
  std::printf("# steps of rank 0 (s): codec prepare (pull_wait) compute apply (push)\n");
  for (size_t i = 0; i < configs.size(); ++i) {
    const PhaseSums& p = rows[i].phases;
    std::printf("#   %-8s %6.2f (%5.2f) %6.2f %6.2f (%5.2f)\n", codecs[i].c_str(), p.prepare,
                p.pull_wait, p.compute, p.apply, p.push);
  }
  // On loopback a run is CPU-bound: whether a codec can cost no more wall
  // time than none is decided by the CPU it spends, which this shows.
  std::printf(
      "# whole runs (cluster start to stop: setup, the steps, the flush, the evaluation), CPU of "
      "this process (every worker, shard and ZeroMQ thread, user + system): cores = cpu_s / "
      "wall_s; cpu_x = cpu_s / none's cpu_s; wall_x = wall_s / none's wall_s; wall_floor_x = "
      "cpu_s / (%d cores x none's wall_s), the least wall_x any schedule of this CPU on the %d "
      "cores this process may use could reach (medians over rounds)\n",
      cores, cores);
  std::printf("#   %-8s %8s %6s %6s %6s %12s\n", "codec", "cpu_s", "cores", "cpu_x", "wall_x",
              "wall_floor_x");
  for (size_t i = 0; i < configs.size(); ++i) {
    const CodecRow& row = rows[i];
    std::printf("#   %-8s %8.2f %6.2f %6.2f %6.2f %12.2f\n", codecs[i].c_str(), row.cpu_s,
                row.run_cores, row.cpu_x, row.wall_x, row.wall_floor_x);
  }
  std::printf("# #wrong total: %llu\n", static_cast<unsigned long long>(total_wrong));

  const std::string csv = args.csv.empty() ? "out/compress.csv" : args.csv;
  const std::string png = args.png.empty() ? "out/compress.png" : args.png;
  const bool csv_written = WriteCsvReport(table, csv);
  int rc = failures > 0 || total_wrong > 0 || !csv_written ? 1 : 0;
  if (table.rows() == 0) return 1;
  const int x = table.ColumnOf("push_B/step"), y = table.ColumnOf("psnr_dB");
  std::ostringstream gp;
  gp << "set terminal pngcairo size 900,600 font ',10'\n"
     << "set output " << GnuplotQuote(png) << "\n"
     << "set datafile separator ','\n"
     << "set title "
     << GnuplotQuote("PSNR after " + std::to_string(c0.training.steps) +
                     " steps vs bytes pushed (" + std::to_string(c0.distributed.world_size) +
                     " workers, " + std::to_string(c0.ps.shards) + " shards, batch " +
                     std::to_string(c0.training.batch_size) + ", bsp)")
     << "\n"
     << "set xlabel 'bytes pushed per step per worker'\nset ylabel 'PSNR (dB)'\n"
     << "set logscale x\nset grid\nset offsets graph 0.1, graph 0.1, graph 0.1, graph 0.1\n"
     << "plot " << GnuplotQuote(csv) << " every ::1 using " << x << ":" << y
     << " with points pt 7 ps 1.5 notitle, '' every ::1 using " << x << ":" << y
     << ":1 with labels offset char 0,1 notitle\n";
  if (!RunGnuplot(gp.str(), png)) rc = 1;
  return rc;
}

}  // namespace gridsync::bench::compress
