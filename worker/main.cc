// gridsync-worker: trains the configured task. Until the parameter server
// lands, only --standalone (one process, local Adam) can run; distributed
// settings are validated and refused with "not supported yet".
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/config.h"
#include "common/logging.h"
#include "worker/image_task.h"
#include "worker/trainer.h"

int main(int argc, char** argv) {
  CLI::App app{"gridsync-worker: trains a hash-grid model"};
  std::string config_path = "configs/local.json";
  std::vector<std::string> overrides;
  bool standalone = false;
  std::string log_level = "info";
  app.add_option("-c,--config", config_path, "JSON config file")->check(CLI::ExistingFile);
  app.add_option("--set", overrides, "Override a config key: --set training.steps=200 (repeatable)");
  app.add_flag("--standalone", standalone, "Train in this process alone, ignoring the distributed section");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  CLI11_PARSE(app, argc, argv);
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
  auto image = gridsync::ImageTask::Load(config->task.image);
  if (!image.ok()) {
    spdlog::error("task.image: {}", image.status().message());
    return gridsync::kConfigErrorExitCode;
  }
  spdlog::info("fitting {} ({}x{}) for {} steps", config->task.image, image->width(), image->height(),
               config->training.steps);
  auto report = gridsync::TrainImage(*config, *image);
  if (!report.ok()) {
    spdlog::error("training failed: {}", report.status().ToString());
    return 1;
  }
  spdlog::info("done: PSNR {:.2f} dB, loss {:.6f}, {:.0f} samples/s, reconstruction {}", report->psnr,
               report->final_loss, report->samples_per_second, report->png_path);
  nlohmann::json summary = {{"psnr_db", report->psnr},
                            {"final_loss", report->final_loss},
                            {"steps", report->steps},
                            {"samples_per_second", report->samples_per_second},
                            {"train_seconds", report->train_seconds},
                            {"skipped_steps", report->skipped_steps},
                            {"grid_rows_per_step", report->grid_rows_per_step},
                            {"n_params", report->n_params},
                            {"png", report->png_path}};
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}
