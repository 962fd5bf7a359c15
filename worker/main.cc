// gridsync-worker: trains the configured task, either alone (--standalone, or
// distributed.enable false: one process, local Adam) or as one worker of a
// cluster with gradient_sync "ps" (the PS shards run Adam). Settings whose
// feature has not landed are refused with "not supported yet" (exit 2).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/cli_parse.h"
#include "common/config.h"
#include "common/logging.h"
#include "worker/allreduce_trainer.h"
#include "worker/hybrid_trainer.h"
#include "worker/image_task.h"
#include "worker/ps_trainer.h"
#include "worker/trainer.h"
#include "worker/worker_placement.h"

int main(int argc, char** argv) {
  CLI::App app{"gridsync-worker: trains a hash-grid model"};
  std::string config_path = "configs/local.json";
  std::vector<std::string> overrides;
  bool standalone = false;
  std::string log_level = "info";
  app.add_option("-c,--config", config_path, "JSON config file");
  app.add_option("--set", overrides, "Override a config key: --set training.steps=200 (repeatable)");
  app.add_flag("--standalone", standalone, "Train in this process alone, ignoring the distributed section");
  gridsync::PsWorkerOptions ps_options;
  app.add_option("--rank", ps_options.rank, "Worker rank (default: assigned by the coordinator)");
  std::string node_name;
  std::string host_flag;
  app.add_option("--node", node_name,
                 "This worker's node (distributed.nodes[].name); default: the node of --rank");
  app.add_option("--host", host_flag,
                 "Address to bind and advertise; default: GRIDSYNC_HOST, then the address of "
                 "interface GRIDSYNC_SOCKET_IFNAME, then the node's host in the config");
  app.add_option(
      "--start-step", ps_options.start_step,
      "Resume at this step: the shards loaded its checkpoint (gridsync launch --resume)");
  app.add_option("--dump-params", ps_options.dump_params,
                 "Rank 0: write the final parameters (raw float32) to this file");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  GRIDSYNC_PARSE_COMMAND_LINE(app, argc, argv);
  gridsync::InitLogging("worker", log_level);

  auto config = gridsync::Config::LoadFile(config_path, overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  if (auto runnable = config->CheckRunnable(standalone); !runnable.ok()) {
    std::fprintf(stderr, "%s: %s\n", config_path.c_str(), runnable.message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  const bool distributed = !standalone && config->distributed.enable;
  gridsync::CollectiveEndpoint endpoint;
  if (distributed) {
    auto placed = gridsync::PlaceWorker(*config, &ps_options.rank, node_name, host_flag);
    if (!placed.ok()) {
      std::fprintf(stderr, "%s: %s\n", config_path.c_str(), placed.status().message().c_str());
      return gridsync::kConfigErrorExitCode;
    }
    ps_options.node = placed->node;
    ps_options.local_rank = static_cast<uint32_t>(std::max(placed->local_rank, 0));
    endpoint = placed->endpoint;
    spdlog::info("worker {} on node {} at {} ({})", ps_options.rank, placed->node,
                 endpoint.hostname, placed->host_source);
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
  if (!distributed || ps_options.rank <= 0) {
    if (auto writable = gridsync::ImageTask::CheckWritableFolder(config->task.output);
        !writable.ok()) {
      std::fprintf(stderr, "%s: task.output: %s\n", config_path.c_str(),
                   writable.message().c_str());
      return gridsync::kConfigErrorExitCode;
    }
  }
  gridsync::Result<gridsync::TrainReport> report = gridsync::Status::Internal("not run");
  if (!distributed) {
    report = gridsync::TrainImage(*config, *image);
  } else if (config->distributed.gradient_sync == gridsync::GradientSync::kPs) {
    report = gridsync::TrainImagePs(*config, *image, ps_options);
  } else if (config->distributed.gradient_sync == gridsync::GradientSync::kHybrid) {
    gridsync::HybridWorkerOptions options;
    options.ps = ps_options;
    options.endpoint = endpoint;
    report = gridsync::TrainImageHybrid(*config, *image, options);
  } else {
    gridsync::AllReduceWorkerOptions options;
    options.endpoint = endpoint;
    report = gridsync::TrainImageAllReduceWorker(*config, *image, ps_options.rank, options);
  }
  if (!report.ok()) {
    spdlog::error("training failed: {}", report.status().ToString());
    return 1;
  }
  if (distributed && report->rank != 0) {
    spdlog::info("worker {} done: {:.0f} samples/s (cluster), pushed {:.2f} MB/step, pulled {:.2f} MB/step, {:.2f} s in communication",
                 report->rank, report->samples_per_second, report->bytes_pushed_per_step / 1e6,
                 report->bytes_pulled_per_step / 1e6, report->comm_seconds);
  } else {
    spdlog::info("done: PSNR {:.2f} dB, loss {:.6f}, {:.0f} samples/s, reconstruction {}", report->psnr,
                 report->final_loss, report->samples_per_second, report->png_path);
  }
  nlohmann::json summary = {{"psnr_db", report->psnr},
                            {"final_loss", report->final_loss},
                            {"steps", report->steps},
                            {"samples_per_second", report->samples_per_second},
                            {"train_seconds", report->train_seconds},
                            {"skipped_steps", report->skipped_steps},
                            {"grid_rows_per_step", report->grid_rows_per_step},
                            {"n_params", report->n_params},
                            {"png", report->png_path}};
  if (distributed) {
    summary["rank"] = report->rank;
    summary["bytes_pushed_per_step"] = report->bytes_pushed_per_step;
    summary["bytes_pulled_per_step"] = report->bytes_pulled_per_step;
    summary["comm_seconds"] = report->comm_seconds;
    summary["max_staleness"] = report->max_staleness;
    if (report->rank != 0) summary.erase("psnr_db");
  }
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}
