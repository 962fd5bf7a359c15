// gridsync-bench train's shared setup (bench_train_setup.h).
#include "tools/bench_train_setup.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kernels/cpu/gemm.h"
#include "spec/run_spec.h"
#include "tools/bench.h"
#include "worker/worker_precheck.h"

namespace gridsync::bench {

// The config a run on `threads` threads trains with: the file, the --set
// overrides, then the bench's own settings.
Result<Config> TrainConfig(const TrainArgs& args, int threads) {
  // Keys the bench sets itself: a --set of one would be overridden, so it is
  // refused rather than silently ignored.
  const std::pair<const char*, const char*> owned[] = {
      {"training.steps", "--steps"},
      {"training.threads", "--threads or --scaling"},
      {"training.device", "--device"},
      {"training.log_every", "no flag: the bench trains quietly"}};
  for (const std::string& o : args.overrides) {
    const std::string key = o.substr(0, o.find('='));
    for (const auto& [name, flag] : owned) {
      if (key == name) {
        return Status::InvalidArgument("--set " + o + ": gridsync-bench train sets " + name +
                                       " itself; use " + flag);
      }
    }
  }
  std::vector<std::string> overrides = args.overrides;
  overrides.push_back("training.steps=" + std::to_string(args.steps));
  overrides.push_back("training.threads=" + std::to_string(threads));
  overrides.push_back("training.log_every=0");
  overrides.push_back("training.device=" + args.device);
  return LoadStandaloneConfig(args.config, overrides);
}

// What must hold before any training starts, so that a run of minutes does
// not end in an allocation failure or an unwritable --json: the worker's
// memory check (worker_precheck.h, as gridsync-worker and check-config
// run it) and --eval-steps within the run.
Status CheckBeforeTraining(const TrainArgs& args, const Config& config, const ImageTask& image) {
  GRIDSYNC_ASSIGN_OR_RETURN(const RunSpec spec, RunSpec::Resolve(config));
  GRIDSYNC_RETURN_IF_ERROR(
      CheckWorkerMemory(spec, image, /*distributed=*/false, /*writes_png=*/false));
  for (const uint64_t step : args.eval_steps) {
    if (step == 0 || step > static_cast<uint64_t>(args.steps)) {
      return Status::InvalidArgument("--eval-steps " + std::to_string(step) +
                                     ": no such step; allowed: 1.." + std::to_string(args.steps) +
                                     " (--steps)");
    }
  }
  // --json is checked when parsed (OutputFile(), common/cli_parse.h).
  return Status::OK();
}

// --warmup-steps as resolved for a run of `steps` steps.
uint64_t WarmupSteps(const TrainArgs& args, int steps) {
  if (args.warmup_steps >= 0) return static_cast<uint64_t>(std::min(args.warmup_steps, steps));
  return static_cast<uint64_t>(std::min(steps / 10, 50));
}

std::string FormatThousands(const std::vector<double>& rates) {
  std::string out;
  for (double r : rates) {
    if (!out.empty()) out += ',';
    out += std::to_string(std::lround(r / 1e3));
    out += 'k';
  }
  return out;
}

void SetGemm(const std::string& gemm) {
  cpu::SetGemmEngine(gemm == "eigen"    ? cpu::GemmEngine::kEigen
                     : gemm == "onednn" ? cpu::GemmEngine::kOneDnn
                                        : cpu::GemmEngine::kAuto);
}

}  // namespace gridsync::bench
