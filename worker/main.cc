// gridsync-worker: trains the configured task, either alone (--standalone, or
// distributed.enable false: one process, local Adam) or as one worker of a
// cluster in the config's gradient_sync mode (worker/sync/train.h). What
// cannot run is refused before anything starts (exit 2): the same check
// `gridsync check-config` runs, then a memory estimate for the batch.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/cli_parse.h"
#include "common/cluster_layout.h"
#include "common/config.h"
#include "common/file_bytes.h"
#include "common/file_limit.h"
#include "common/host_address.h"
#include "common/logging.h"
#include "common/message_heap.h"
#include "common/wire/curve.h"
#include "ops/metrics.h"
#include "ops/progress_line.h"
#include "ops/service_watchdog.h"
#include "ops/timeline.h"
#include "worker/image_task.h"
#include "worker/step_progress.h"
#include "worker/step_timeline.h"
#include "worker/sync/train.h"
#include "worker/worker_metrics.h"
#include "worker/worker_placement.h"
#include "worker/worker_precheck.h"

namespace {

// A stop signal is named in the log, then its default action ends the
// process as before (a worker has nothing to save: the shards and the
// checkpoints hold the run). Only write(2) and signal calls here, which
// are async-signal-safe. A probe saw workers vanish on SIGTERM without a
// line.
template <size_t N>
void SayAndDie(int signal_number, const char (&line)[N]) {
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, line, N - 1);
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

extern "C" void OnStopSignal(int signal_number) {
  if (signal_number == SIGTERM)
    SayAndDie(signal_number, "gridsync-worker: received SIGTERM; exiting\n");
  else
    SayAndDie(signal_number, "gridsync-worker: received SIGINT; exiting\n");
}

}  // namespace

int main(int argc, char** argv) {
  gridsync::KeepStandardStreamsOpen();  // before any descriptor is made
  gridsync::IgnoreHangup();             // nothing to reload: the config is read once
  std::signal(SIGTERM, OnStopSignal);
  std::signal(SIGINT, OnStopSignal);
  // Under a watchdog (systemd's WatchdogSec, gridsync launch), pings while
  // the process runs: a stopped worker is replaced, not only reported.
  gridsync::WatchdogPinger pinger(gridsync::ServiceWatchdog::FromEnvironment());
  CLI::App app{"gridsync-worker: trains a hash-grid model"};
  std::string config_path = "configs/local.json";
  std::vector<std::string> overrides;
  bool standalone = false;
  std::string log_level = "info";
  app.add_option("-c,--config", config_path, "JSON config file");
  app.add_option("--set", overrides,
                 "Override a config key: --set training.steps=200 (repeatable)");
  app.add_flag("--standalone", standalone,
               "Train in this process alone, ignoring the distributed section");
  gridsync::WorkerOptions ps_options;
  app.add_option("--rank", ps_options.rank, "Worker rank (default: assigned by the coordinator)")
      ->check(gridsync::IndexNumber(1 << 20));  // the config's workers bound it once loaded
  std::string node_name;
  std::string host_flag;
  app.add_option("--node", node_name,
                 "This worker's node (distributed.nodes[].name); default: the node of --rank");
  app.add_option("--host", host_flag,
                 "Address to bind and advertise; default: GRIDSYNC_HOST, then the address of "
                 "interface GRIDSYNC_SOCKET_IFNAME, then the node's host in the config")
      ->check(gridsync::HostSyntax());
  app.add_option(
         "--start-step", ps_options.start_step,
         "Resume at this step from its checkpoint (the shards', and this worker's where it holds "
         "state: under nccl the whole model; gridsync launch --resume passes it)")
      ->check(gridsync::StepNumber());
  app.add_option("--dump-params", ps_options.dump_params,
                 "The worker holding the final model (rank 0, or a standalone run): write its "
                 "parameters (raw float32, tables in order) to this file")
      ->check(gridsync::NotEmpty("a file to write"));
  app.add_option("--eval-every", ps_options.train.eval_every,
                 "The worker holding the model (rank 0, or a standalone run): evaluate PSNR every "
                 "this many steps, not timed, for the PSNR-against-time curve (psnr_curve in the "
                 "JSON line); under ps and hybrid each evaluation pulls the whole model first")
      ->check(gridsync::StepNumber());
  gridsync::OpsFlags ops;
  gridsync::AddOpsFlags(app, &ops, "every step's phases");
  double metrics_hold = 0;
  app.add_option("--metrics-hold", metrics_hold,
                 "After training, keep serving metrics this many seconds (a last scrape)")
      ->check(gridsync::FiniteRange(0.0, 3600.0));
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  bool check_only = false;
  app.add_flag("--check-only", check_only,
               "Check the command line, the config, the image and this host as a start would, "
               "then exit (0: it would start) without connecting or training");
  GRIDSYNC_PARSE_COMMAND_LINE(app, argc, argv);
  gridsync::InitLogging("worker", log_level);
  // A worker holds a socket (and ZeroMQ's descriptors for it) per shard and
  // per collective peer: past the soft limit libzmq asserts and the worker
  // aborts, so it raises the limit as the servers do (common/file_limit.h).
  gridsync::RaiseOpenFileLimitForServing();

  auto config = gridsync::Config::LoadFile(config_path, overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  gridsync::LogConfigNotes(config_path, config->NotesFor(standalone));
  if (auto runnable = config->CheckRunnable(standalone); !runnable.ok()) {
    std::fprintf(stderr, "%s: %s\n", config_path.c_str(), runnable.message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  // Every value derived from the config, once, for the whole run.
  auto spec = gridsync::RunSpec::Resolve(*config);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  const bool distributed = !standalone && config->distributed.enable;
  // Pushes and pulls of a few MiB every step: mapped fresh and unmapped
  // each time with glibc's defaults (common/message_heap.h). Before the
  // trainer and the clients allocate; its tables map their own memory
  // (common/huge_pages.h), so the trainer keeps its huge pages.
  if (distributed && spec->sync.ps_messages && !gridsync::TuneHeapForMessages())
    spdlog::warn("the C library kept its heap thresholds (PS messages are mapped)");
  // The unit's WatchdogSec= is fixed; the kill must come before the peers'
  // waits on a stopped worker give up (distributed.timeout_s), whatever
  // timeout_s this config has: retuned to it, as gridsync launch sets it.
  pinger.Retune(gridsync::WorkerWatchdogTimeout(config->distributed.timeout_s));
  if (!distributed && ps_options.rank >= 0) {
    // One process is the whole run: no rank to take (it was ignored).
    std::fprintf(stderr,
                 "%s: --rank %d: a run in one process has no ranks; allowed: --rank only for a "
                 "worker of a cluster (distributed.enable true, without --standalone)\n",
                 config_path.c_str(), ps_options.rank);
    return gridsync::kConfigErrorExitCode;
  }
  if (!distributed && ps_options.start_step > 0) {
    // A run in one process keeps no checkpoints to resume from.
    std::fprintf(stderr,
                 "%s: --start-step %llu: a standalone run keeps no checkpoints to resume from; "
                 "allowed: --start-step only for a worker of a cluster that wrote checkpoints\n",
                 config_path.c_str(), static_cast<unsigned long long>(ps_options.start_step));
    return gridsync::kConfigErrorExitCode;
  }
  if (distributed) {
    auto placed = gridsync::PlaceWorker(*config, &ps_options.rank, node_name, host_flag);
    if (!placed.ok()) {
      std::fprintf(stderr, "%s: %s\n", config_path.c_str(), placed.status().message().c_str());
      return gridsync::kConfigErrorExitCode;
    }
    ps_options.node = placed->node;
    ps_options.local_rank = static_cast<uint32_t>(std::max(placed->local_rank, 0));
    ps_options.endpoint = placed->endpoint;
    spdlog::info("worker {} on node {} at {} ({})", ps_options.rank, placed->node,
                 ps_options.endpoint.hostname, placed->host_source);
    if (auto flag =
            gridsync::CheckMetricsPortFlag(*config, ops.metrics_port, ps_options.endpoint.hostname);
        !flag.ok()) {
      std::fprintf(stderr, "%s: %s\n", config_path.c_str(), flag.message().c_str());
      return gridsync::kConfigErrorExitCode;
    }
  }
  // Its keys before its image: a key file it would refuse (a secret
  // readable by others) failed the worker with exit 1 after the image had
  // loaded; now exit 2 at once, as check-config and launch refuse it.
  if (distributed) {
    if (auto keys = gridsync::wire::CheckRoleKeys(*config, {"worker"}); !keys.ok()) {
      std::fprintf(stderr, "%s: %s\n", config_path.c_str(), keys.message().c_str());
      return gridsync::kConfigErrorExitCode;
    }
  }
  auto image = gridsync::ImageTask::Load(config->task.image);
  if (!image.ok()) {
    spdlog::error("task.image: {}", image.status().message());
    return gridsync::kConfigErrorExitCode;
  }
  spdlog::info("fitting {} ({}x{}) for {} steps", config->task.image, image->width(),
               image->height(), config->training.steps);
  // Rank 0 (or a standalone run) writes the reconstruction at the end: an
  // unwritable task.output must fail now, not after the whole run.
  // Each worker writes its part of every checkpoint (standalone runs keep
  // none: CheckRunnable).
  if (distributed) {
    if (auto cluster = config->CheckClusterProcess("worker", /*create_folders=*/!check_only);
        !cluster.ok()) {
      std::fprintf(stderr, "%s: %s\n", config_path.c_str(), cluster.message().c_str());
      return gridsync::kConfigErrorExitCode;
    }
  }
  // --dump-params likewise: it is written after the whole run, by the
  // worker that holds the final model. Another rank wrote nothing and said
  // nothing (a hostile probe): refused.
  if (!ps_options.dump_params.empty() && distributed && ps_options.rank > 0) {
    std::fprintf(stderr,
                 "--dump-params %s: rank %d holds no final model to write; allowed: "
                 "--dump-params for rank 0 or a standalone run (gridsync launch: --rank0-arg "
                 "--dump-params F)\n",
                 ps_options.dump_params.c_str(), ps_options.rank);
    return gridsync::kConfigErrorExitCode;
  }
  // The files the flags name, now: --timeline /tmp (a folder) passed
  // --check-only and failed the start (a hostile probe).
  for (const auto& [flag, path] :
       {std::pair<const char*, const std::string&>{"--dump-params", ps_options.dump_params},
        {"--timeline", ops.timeline}}) {
    if (path.empty()) continue;
    if (auto writable = gridsync::CheckOutputFile(path, /*create=*/!check_only); !writable.ok()) {
      std::fprintf(stderr, "%s %s\n", flag, writable.message().c_str());
      return gridsync::kConfigErrorExitCode;
    }
  }
  // A resume takes the shards' (and this worker's) state of that step from
  // the checkpoints: with none written, the start failed later, saying only
  // that a pull asked for a version the shards had not reached.
  if (distributed && ps_options.start_step > 0 && config->checkpoint.every_steps <= 0) {
    std::fprintf(stderr,
                 "%s: --start-step %llu: checkpoint.every_steps is 0, so the job has no "
                 "checkpoints to resume from; allowed: --start-step with a config that writes "
                 "checkpoints (checkpoint.every_steps > 0), or a start at step 0\n",
                 config_path.c_str(), static_cast<unsigned long long>(ps_options.start_step));
    return gridsync::kConfigErrorExitCode;
  }
  if (!distributed || ps_options.rank <= 0) {
    if (auto writable = gridsync::CheckTaskOutput(config->task.output, /*create=*/!check_only);
        !writable.ok()) {
      std::fprintf(stderr, "%s: task.output: %s\n", config_path.c_str(),
                   writable.message().c_str());
      return gridsync::kConfigErrorExitCode;
    }
  }
  if (auto device = gridsync::CheckTrainingDevice(*config, standalone); !device.ok()) {
    std::fprintf(stderr, "%s: %s\n", config_path.c_str(), device.message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  // The model and the largest micro-batch this process computes must fit
  // in memory: refuse them now, naming the keys, rather than die in an
  // allocation mid-run (the same check as check-config's).
  if (auto fits = gridsync::CheckWorkerMemory(*spec, *image, distributed,
                                              !distributed || ps_options.rank <= 0);
      !fits.ok()) {
    std::fprintf(stderr, "%s: %s\n", config_path.c_str(), fits.message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  const bool serves_metrics =
      ops.metrics_port > 0 || (ops.metrics_port < 0 && config->metrics.port > 0);
  if (metrics_hold > 0 && !serves_metrics) {
    // Nothing to hold open: the flag would do nothing (a hostile probe).
    std::fprintf(stderr,
                 "--metrics-hold %g: this worker serves no metrics (metrics.port is 0 and no "
                 "--metrics-port); allowed: --metrics-hold with a metrics endpoint\n",
                 metrics_hold);
    return gridsync::kConfigErrorExitCode;
  }
  if (ps_options.train.eval_every > 0 && distributed && ps_options.rank > 0) {
    // launch passes --worker-arg to every worker, so this is a note, not a
    // refusal: only the worker holding the model evaluates.
    spdlog::info("--eval-every {}: only rank 0, which holds the model, evaluates; not on rank {}",
                 ps_options.train.eval_every, ps_options.rank);
  }
  if (check_only) {
    // The coordinator's name (and on one machine the shards' hosts) must
    // resolve here, as check-config and launch require (CheckHostsResolve).
    // A start does not refuse it: it keeps trying until
    // distributed.timeout_s and exits 4 (its unit restarts that), since a
    // name may not be served yet while a cluster's machines come up.
    if (distributed) {
      if (auto resolved = gridsync::CheckHostsResolve(*config); !resolved.ok()) {
        std::fprintf(stderr, "%s: %s\n", config_path.c_str(), resolved.message().c_str());
        return gridsync::kConfigErrorExitCode;
      }
    }
    // A cluster on one machine (this one) must fit it whole, as check-config
    // and launch check (a hostile probe: check-config refused a batch the
    // worker's --check-only passed). Only before anything starts: a worker
    // starting beside shards already running would count their memory twice
    // (MemAvailable no longer holds it).
    if (distributed && !config->layout.multi_host) {
      const int shards = static_cast<int>(config->layout.shards.size());
      if (auto together = gridsync::CheckMachineMemory(
              *spec, *image, config->distributed.world_size, shards, /*writes_png=*/true);
          !together.ok()) {
        std::fprintf(stderr, "%s: %s\n", config_path.c_str(), together.message().c_str());
        return gridsync::kConfigErrorExitCode;
      }
    }
    // gridsync launch runs this before it starts anything, so that a bad
    // --worker-arg is refused before the cluster is up.
    spdlog::info("--check-only: the command line, the config and this host allow a start");
    return 0;
  }
  // Metrics: on the worker's own address; the port from metrics.port and the
  // rank, or any free one when the coordinator assigns the rank (the store
  // says where).
  // Declared first, destroyed last: the endpoint (whose scrape threads read
  // worker_metrics) goes before it.
  std::unique_ptr<gridsync::WorkerMetrics> worker_metrics;
  std::unique_ptr<gridsync::MetricsEndpoint> metrics;
  if (serves_metrics) {
    const int shards = static_cast<int>(config->layout.shards.size());
    // A single process (standalone, or distributed.enable false) serves
    // worker 0's port: it ignored metrics.port and took any free one.
    const int port =
        ops.metrics_port > 0 ? ops.metrics_port
        : ps_options.rank >= 0
            ? gridsync::MetricsPortOf(config->metrics.port, "worker", ps_options.rank, shards)
        : !distributed ? gridsync::MetricsPortOf(config->metrics.port, "worker", 0, shards)
                       : 0;
    const std::string host = distributed ? ps_options.endpoint.hostname : "127.0.0.1";
    auto started = gridsync::MetricsEndpoint::Start(
        host, static_cast<uint16_t>(port),
        {{"role", "worker"}, {"rank", std::to_string(std::max(ps_options.rank, 0))}});
    if (!started.ok()) {
      spdlog::error("{}", started.status().ToString());
      return 1;
    }
    metrics = std::move(started).value();
    // The GPU of this rank's local rank, when a driver is there (NVML).
    worker_metrics = std::make_unique<gridsync::WorkerMetrics>(
        *metrics, distributed ? static_cast<int>(ps_options.local_rank) : 0);
    ps_options.train.observers.push_back(worker_metrics.get());
    ps_options.metrics_address = metrics->address();
    spdlog::info("metrics at http://{}/metrics", metrics->address());
  }
  std::unique_ptr<gridsync::TimelineWriter> timeline;
  std::unique_ptr<gridsync::StepTimeline> step_timeline;
  if (!ops.timeline.empty()) {
    auto opened = gridsync::TimelineWriter::Open(
        ops.timeline, "worker " + std::to_string(std::max(ps_options.rank, 0)),
        static_cast<uint32_t>(std::max(ps_options.rank, 0)));
    if (!opened.ok()) {
      std::fprintf(stderr, "%s\n", opened.status().message().c_str());
      return gridsync::kConfigErrorExitCode;
    }
    timeline = std::move(opened).value();
    step_timeline = std::make_unique<gridsync::StepTimeline>(*timeline);
    ps_options.train.observers.push_back(step_timeline.get());
  }
  // Progress: a line redrawn on a terminal (instead of periodic step lines),
  // or "@progress" lines for gridsync launch.
  std::unique_ptr<gridsync::ProgressLine> progress_line;
  std::unique_ptr<gridsync::StepProgress> progress;
  {
    const char* lines = std::getenv("GRIDSYNC_PROGRESS_LINES");
    const bool emit = lines != nullptr && std::string(lines) == "1";
    if (gridsync::ProgressLine::IsTerminal(stderr)) {
      progress_line = std::make_unique<gridsync::ProgressLine>(stderr);
      ps_options.train.step_lines = false;
    }
    if (progress_line || emit) {
      progress = std::make_unique<gridsync::StepProgress>(progress_line.get(), emit);
      ps_options.train.observers.push_back(progress.get());
    }
  }
  // Whether this process trained a step: until it did, a lost coordinator
  // leaves nothing to rejoin, and a restart is only a later start.
  struct StepsTrained : gridsync::StepObserver {
    void OnStep(const gridsync::StepRecord&) override { any = true; }
    std::atomic<bool> any{false};
  } steps_trained;
  ps_options.train.observers.push_back(&steps_trained);
  gridsync::Result<gridsync::TrainReport> report = gridsync::Status::Internal("not run");
  try {
    if (!distributed) {
      report = gridsync::TrainImage(*spec, *image, ps_options.train, ps_options.dump_params);
    } else {
      report = gridsync::TrainWorker(*spec, *image, ps_options);
    }
  } catch (const std::bad_alloc&) {
    report = gridsync::Status::IOError(
        "out of memory with training.batch_size " + std::to_string(config->training.batch_size) +
        " and encoding.log2_hashmap_size " + std::to_string(config->encoding.log2_hashmap_size) +
        "; allowed: a smaller batch or model, or more workers");
  }
  if (!report.ok()) {
    spdlog::error("training failed: {}", report.status().ToString());
    const bool coordinator_lost =
        distributed && report.status().code() == gridsync::StatusCode::kUnavailable;
    if (coordinator_lost && !steps_trained.any) {
      // Not reached (its machine is not up yet) or lost before training
      // began: the processes of a cluster start in any order, so the unit
      // restarts this one (RestartForceExitStatus=4) until the coordinator
      // serves, as it restarts a shard (Restart=on-failure).
      spdlog::error(
          "exit {}: no coordinator before the first step; restarted (its unit does so on this "
          "code) this worker tries again",
          gridsync::kCoordinatorLostExitCode);
      return gridsync::kCoordinatorLostExitCode;
    }
    if (coordinator_lost && config->checkpoint.every_steps > 0 &&
        config->distributed.gradient_sync != gridsync::GradientSyncMode::kNccl) {
      // The job lives on in its checkpoints and the coordinator's state: a
      // restart rejoins it once the coordinator is back.
      spdlog::error(
          "exit {}: the coordinator is gone; restarted (its unit does so on this code) "
          "this worker rejoins the job from its newest complete checkpoint",
          gridsync::kCoordinatorLostExitCode);
      return gridsync::kCoordinatorLostExitCode;
    }
    if (report.status().code() == gridsync::StatusCode::kFailedPrecondition)
      return gridsync::kCannotRejoinExitCode;
    // Checkpoint files of another run: as a shard does, exit 3, which
    // neither its unit nor gridsync launch restarts into the same refusal.
    if (report.status().code() == gridsync::StatusCode::kCheckpointsHeld)
      return gridsync::kCheckpointsHeldExitCode;
    return 1;
  }
  if (distributed && report->rank != 0) {
    spdlog::info(
        "worker {} done: {:.0f} samples/s (cluster), pushed {:.2f} MB/step, pulled {:.2f} MB/step, "
        "{:.2f} s in communication",
        report->rank, report->samples_per_second, report->bytes_pushed_per_step / 1e6,
        report->bytes_pulled_per_step / 1e6, report->comm_seconds);
  } else {
    spdlog::info("done: PSNR {:.2f} dB, loss {:.6f}, {:.0f} samples/s, reconstruction {}",
                 report->psnr, report->final_loss, report->samples_per_second, report->png_path);
  }
  nlohmann::json summary = {{"psnr_db", report->psnr},
                            {"final_loss", report->final_loss},
                            {"steps", report->steps},
                            {"samples_per_second", report->samples_per_second},
                            {"samples", report->samples},
                            {"my_samples", report->my_samples},
                            {"train_seconds", report->train_seconds},
                            {"skipped_steps", report->skipped_steps},
                            {"grid_rows_per_step", report->grid_rows_per_step},
                            {"n_params", report->n_params},
                            {"png", report->png_path}};
  if (!report->psnr_curve.empty()) {
    auto& curve = summary["psnr_curve"] = nlohmann::json::array();
    for (const auto& p : report->psnr_curve) curve.push_back({p.step, p.seconds, p.psnr});
  }
  if (distributed) {
    summary["rank"] = report->rank;
    summary["bytes_pushed_per_step"] = report->bytes_pushed_per_step;
    summary["bytes_pulled_per_step"] = report->bytes_pulled_per_step;
    summary["comm_seconds"] = report->comm_seconds;
    // Of comm_seconds under ps and hybrid: worker Adam and the codecs with
    // their error feedback (0 where they do not run).
    summary["worker_adam_seconds"] = report->worker_adam_seconds;
    summary["codec_seconds"] = report->codec_seconds;
    summary["max_staleness"] = report->max_staleness;
    summary["mean_staleness"] = report->mean_staleness;
    if (report->rank != 0) summary.erase("psnr_db");
  }
  std::printf("%s\n", summary.dump().c_str());
  std::fflush(stdout);
  if (timeline) {
    // --timeline was asked for: a file cut short (a full disk) fails the run
    // as --dump-params does, instead of exit 0 over a broken trace.
    if (const gridsync::Status closed = timeline->Close(); !closed.ok()) {
      spdlog::error("{}", closed.message());
      return 1;
    }
  }
  if (metrics && metrics_hold > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(metrics_hold));
  }
  if (report->checkpoint_failures > 0) {
    // Trained, but its own part of some checkpoints is missing: the run does
    // not end as if they were there (the shards exit the same code).
    spdlog::error(
        "{} checkpoint(s) of this worker were not written (the errors above name why): the "
        "checkpoints in {} may be incomplete",
        report->checkpoint_failures, config->checkpoint.dir);
    return gridsync::kCheckpointsNotWrittenExitCode;
  }
  return 0;
}
