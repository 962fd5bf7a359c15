// gridsync-bench train's arguments and the setup its runs share: the
// config a run trains with, the checks before any training starts, the
// steady-state warmup and the GEMM engine. bench_train.cc runs one
// training (and the PyTorch peer); bench_train_scaling.cc compares thread
// counts.
//
// Thread safety: plain functions; SetGemm before any training.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/image_task.h"

namespace gridsync::bench {

struct TrainArgs {
  std::string config = "configs/local.json";
  std::vector<std::string> overrides;
  int steps = 500;
  int threads = 1;
  bool vs_torch = false;
  int torch_steps = 0;   // 0: same as steps
  int torch_rounds = 1;  // --vs-torch: rounds of both, alternating which goes first
  // Steps before the steady timing starts, on both sides (-1: a tenth of
  // --steps, at most 50).
  int warmup_steps = -1;
  std::vector<uint64_t> eval_steps;
  std::string json_out;
  std::string python = "/usr/bin/python3";
  std::string device = "cpu";  // training.device: cpu (the default here), cuda or auto
  std::string gemm = "auto";   // the MLP's GEMM engine: auto, eigen or onednn
  std::vector<int> scaling;    // --scaling: thread counts to compare
  int repeats = 5;             // --scaling: rounds
};

// The config a run on `threads` threads trains with: the file, the --set
// overrides, then the bench's own settings.
Result<Config> TrainConfig(const TrainArgs& args, int threads);

// What must hold before any training starts (see bench_train_setup.cc).
Status CheckBeforeTraining(const TrainArgs& args, const Config& config, const ImageTask& image);

// --warmup-steps as resolved for a run of `steps` steps.
uint64_t WarmupSteps(const TrainArgs& args, int steps);

// Rates as a table cell: "816k,842k" (thousands, rounded).
std::string FormatThousands(const std::vector<double>& rates);

// The MLP's GEMM engine, by its --gemm name.
void SetGemm(const std::string& gemm);

// --scaling (bench_train_scaling.cc).
int RunScaling(const TrainArgs& args);

}  // namespace gridsync::bench
